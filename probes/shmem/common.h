/* Shared harness of the shmem probes (issue #16: paging shared anonymous memory).
 *
 * Roles, as in the daemon:
 *   D  the "daemon": the probe's main process (root). It maps none of the probed memory.
 *   P  a "program": a child of D. It maps the probed region (MAP_SHARED|MAP_ANONYMOUS, a
 *      shared /dev/zero mapping or a memfd) and forks
 *   C  the program's child, which shares the region with P by fork.
 * P and C run a command loop (worker_loop): D sends a command over a pipe, the worker does
 * it (touches a page, makes a uffd, madvise, ...) and answers. While D waits for an answer
 * it serves every uffd it holds (serve_until_reply): that is how a fault taken in P or C is
 * seen, logged (which uffd, which page, which thread) and answered.
 *
 * Every line a probe prints that states a finding starts with "RESULT".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Debian 12's headers are 6.1's; the kernel here is newer. */
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
struct uffdio_move_ {
	uint64_t dst, src, len, mode;
	int64_t move;
};
#define UFFDIO_MOVE_ _IOWR(UFFDIO, 0x05, struct uffdio_move_)
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 1U
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

#define PS 4096UL
#define PM_PRESENT (1ULL << 63)
#define PM_SWAP (1ULL << 62)
#define PM_FILE (1ULL << 61)
#define PM_EXCL (1ULL << 56)
#define PM_UFFD_WP (1ULL << 57)

#define DIE(...)                                                                             \
	do {                                                                                     \
		fprintf(stderr, "FATAL %s:%d: ", __FILE__, __LINE__);                              \
		fprintf(stderr, __VA_ARGS__);                                                     \
		fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));                      \
		exit(2);                                                                          \
	} while (0)

static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- backings ---------------------------------------------------------------------------- */
enum backing { SHANON, DEVZERO, MEMFD, NBACKING };
static const char *backing_name[] = {"MAP_SHARED|MAP_ANONYMOUS", "/dev/zero MAP_SHARED",
				     "memfd MAP_SHARED"};

static char *map_backing(enum backing b, size_t npages, int *memfd_out)
{
	void *p = MAP_FAILED;
	size_t len = npages * PS;
	if (memfd_out)
		*memfd_out = -1;
	if (b == SHANON) {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	} else if (b == DEVZERO) {
		int fd = open("/dev/zero", O_RDWR);
		if (fd < 0)
			DIE("open /dev/zero");
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	} else {
		int fd = memfd_create("probe", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, len))
			DIE("memfd");
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (memfd_out)
			*memfd_out = fd;
		else
			close(fd);
	}
	if (p == MAP_FAILED)
		DIE("mmap %s", backing_name[b]);
	return p;
}

/* ---- uffd -------------------------------------------------------------------------------- */
static int uffd_new(uint64_t features, uint64_t *granted)
{
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	struct uffdio_api api = {.api = UFFD_API, .features = features};
	if (ioctl(fd, UFFDIO_API, &api)) {
		int e = errno;
		close(fd);
		return -e;
	}
	if (granted)
		*granted = api.features;
	return fd;
}

static int uffd_register(int uffd, void *addr, size_t len, uint64_t mode, uint64_t *ioctls)
{
	struct uffdio_register r = {.range = {(uintptr_t)addr, len}, .mode = mode};
	if (ioctl(uffd, UFFDIO_REGISTER, &r))
		return -errno;
	if (ioctls)
		*ioctls = r.ioctls;
	return 0;
}

static int uffd_copy(int uffd, void *dst, const void *src, size_t len, uint64_t mode)
{
	struct uffdio_copy c = {.dst = (uintptr_t)dst, .src = (uintptr_t)src, .len = len,
				.mode = mode};
	if (ioctl(uffd, UFFDIO_COPY, &c))
		return -errno;
	return 0;
}

static int uffd_wake(int uffd, void *addr, size_t len)
{
	struct uffdio_range r = {(uintptr_t)addr, len};
	return ioctl(uffd, UFFDIO_WAKE, &r) ? -errno : 0;
}

static int uffd_wp(int uffd, void *addr, size_t len, int on, int dontwake)
{
	struct uffdio_writeprotect w = {.range = {(uintptr_t)addr, len},
					.mode = (on ? UFFDIO_WRITEPROTECT_MODE_WP : 0) |
						(dontwake ? UFFDIO_WRITEPROTECT_MODE_DONTWAKE : 0)};
	return ioctl(uffd, UFFDIO_WRITEPROTECT, &w) ? -errno : 0;
}

static int uffd_continue(int uffd, void *addr, size_t len)
{
	struct uffdio_continue c = {.range = {(uintptr_t)addr, len}};
	return ioctl(uffd, UFFDIO_CONTINUE, &c) ? -errno : 0;
}

/* ---- /proc helpers ----------------------------------------------------------------------- */
static uint64_t pagemap_entry(pid_t pid, void *addr)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/pagemap", pid);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		DIE("open %s", path);
	uint64_t e = 0;
	if (pread(fd, &e, 8, ((uintptr_t)addr / PS) * 8) != 8)
		DIE("pread pagemap");
	close(fd);
	return e;
}

static const char *pm_str(uint64_t e)
{
	static char buf[8][96];
	static int i;
	char *b = buf[i++ & 7];
	snprintf(b, 96, "%s%s%s%s%s", e & PM_PRESENT ? "present " : "not-present ",
		 e & PM_SWAP ? "swap " : "", e & PM_FILE ? "file/shared " : "",
		 e & PM_EXCL ? "exclusive " : "", e & PM_UFFD_WP ? "uffd-wp" : "");
	return b;
}

/* RssShmem of a process, in kB */
static long rss_shmem_kb(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	long v = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "RssShmem: %ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

static long meminfo_kb(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	size_t kl = strlen(key);
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = atol(line + kl + 1);
			break;
		}
	fclose(f);
	return v;
}

/* The /proc/PID/maps line of the mapping that holds addr (without the newline). */
static int maps_line(pid_t pid, void *addr, char *out, size_t outlen)
{
	char path[64], line[512];
	snprintf(path, sizeof path, "/proc/%d/maps", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int found = -1;
	while (fgets(line, sizeof line, f)) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx", &s, &e) == 2 && (uintptr_t)addr >= s &&
		    (uintptr_t)addr < e) {
			line[strcspn(line, "\n")] = 0;
			snprintf(out, outlen, "%s", line);
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

/* The VmFlags of the smaps entry that holds addr. */
static int smaps_vmflags(pid_t pid, void *addr, char *out, size_t outlen)
{
	char path[64], line[512];
	snprintf(path, sizeof path, "/proc/%d/smaps", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int in = 0, found = -1;
	while (fgets(line, sizeof line, f)) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx ", &s, &e) == 2 && strchr(line, ' ') &&
		    line[strcspn(line, " ")] == ' ' && strchr(line, '-') < strchr(line, ' '))
			in = (uintptr_t)addr >= s && (uintptr_t)addr < e;
		if (in && !strncmp(line, "VmFlags:", 8)) {
			line[strcspn(line, "\n")] = 0;
			snprintf(out, outlen, "%s", line + 9);
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

/* Open the shmem inode behind P's mapping at addr the way a root daemon can: through
 * /proc/PID/map_files/START-END. */
static int open_map_files(pid_t pid, void *addr, unsigned long *start_out)
{
	char line[512], path[128];
	if (maps_line(pid, addr, line, sizeof line))
		return -ENOENT;
	unsigned long s, e;
	sscanf(line, "%lx-%lx", &s, &e);
	snprintf(path, sizeof path, "/proc/%d/map_files/%lx-%lx", pid, s, e);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (start_out)
		*start_out = s;
	return fd;
}

static int pidfd_getfd_of(pid_t pid, int remotefd)
{
	int pidfd = syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0)
		DIE("pidfd_open");
	int fd = syscall(SYS_pidfd_getfd, pidfd, remotefd, 0);
	if (fd < 0)
		DIE("pidfd_getfd");
	close(pidfd);
	return fd;
}

/* ---- the workers (P and C) --------------------------------------------------------------- */
enum op {
	OP_READ = 1,   /* val = first u64 of page */
	OP_WRITE,      /* first u64 of page = val */
	OP_FILL,       /* whole page = byte val */
	OP_CHECKFILL,  /* r = number of bytes of page != byte val */
	OP_MINCORE,    /* val = mincore byte */
	OP_MADVISE,    /* madvise(page, arg pages, val) */
	OP_UFFD,       /* make a uffd with features val, register the region (all pages) with
			  mode arg; r = fd (D takes it with pidfd_getfd) */
	OP_FORK,       /* fork C, which runs worker_loop on the second pipe pair; r = pid */
	OP_HAMMER,     /* start arg threads doing atomic +1 on u64 #0 of page */
	OP_HAMMER_STOP,/* stop them; val = sum of their increments */
	OP_GETPID,
	OP_EXIT,
};
struct cmd {
	int op, page;
	uint64_t val, arg;
};
struct reply {
	int64_t r;
	uint64_t val;
	int err;
};

struct worker {
	const char *name;
	pid_t pid;
	int cmd_w, rep_r; /* D's ends */
	int cmd_r, rep_w; /* the worker's ends */
};

static char *g_region; /* the probed region, same address in P and C */
static size_t g_npages;
static struct worker g_w[2]; /* P and C */

static volatile int hammer_stop;
static volatile uint64_t hammer_count[16];
static int hammer_n;
static pthread_t hammer_t[16];
static int hammer_page;
static void *hammer_fn(void *a)
{
	long i = (long)a;
	volatile uint64_t *p = (uint64_t *)(g_region + hammer_page * PS);
	uint64_t n = 0;
	while (!hammer_stop) {
		__atomic_fetch_add(p, 1, __ATOMIC_SEQ_CST);
		n++;
	}
	hammer_count[i] = n;
	return NULL;
}

static void worker_loop(struct worker *me);

static void worker_do(struct worker *me, struct cmd *c, struct reply *r)
{
	char *pg = g_region + (size_t)c->page * PS;
	r->r = 0;
	r->err = 0;
	switch (c->op) {
	case OP_READ:
		r->val = *(volatile uint64_t *)pg;
		break;
	case OP_WRITE:
		*(volatile uint64_t *)pg = c->val;
		break;
	case OP_FILL:
		memset(pg, (int)c->val, PS);
		break;
	case OP_CHECKFILL: {
		long bad = 0;
		for (size_t i = 0; i < PS; i++)
			bad += ((volatile unsigned char *)pg)[i] != (unsigned char)c->val;
		r->r = bad;
		r->val = ((volatile unsigned char *)pg)[0];
		break;
	}
	case OP_MINCORE: {
		unsigned char v = 0xff;
		r->r = mincore(pg, PS, &v) ? -errno : 0;
		r->val = v;
		break;
	}
	case OP_MADVISE:
		r->r = madvise(pg, c->arg * PS, (int)c->val) ? -errno : 0;
		break;
	case OP_UFFD: {
		uint64_t granted = 0;
		int fd = uffd_new(c->val, &granted);
		if (fd < 0) {
			r->r = fd;
			break;
		}
		r->val = granted;
		int e = uffd_register(fd, g_region, g_npages * PS, c->arg, NULL);
		r->r = e ? e : fd;
		break;
	}
	case OP_FORK: {
		pid_t pid = fork();
		if (pid < 0) {
			r->r = -errno;
			break;
		}
		if (pid == 0) {
			g_w[1].pid = getpid();
			worker_loop(&g_w[1]);
			_exit(0);
		}
		r->r = pid;
		break;
	}
	case OP_HAMMER:
		hammer_stop = 0;
		hammer_n = (int)c->arg;
		hammer_page = c->page;
		for (long i = 0; i < hammer_n; i++)
			pthread_create(&hammer_t[i], NULL, hammer_fn, (void *)i);
		break;
	case OP_HAMMER_STOP: {
		hammer_stop = 1;
		uint64_t s = 0;
		for (int i = 0; i < hammer_n; i++) {
			pthread_join(hammer_t[i], NULL);
			s += hammer_count[i];
		}
		r->val = s;
		break;
	}
	case OP_GETPID:
		r->r = getpid();
		break;
	case OP_EXIT:
		_exit(0);
	}
}

static void worker_loop(struct worker *me)
{
	struct cmd c;
	struct reply r;
	for (;;) {
		ssize_t n = read(me->cmd_r, &c, sizeof c);
		if (n != sizeof c)
			_exit(0);
		worker_do(me, &c, &r);
		if (write(me->rep_w, &r, sizeof r) != sizeof r)
			_exit(0);
	}
}

/* ---- D: the uffds it holds and how it answers them ----------------------------------------- */
struct duffd {
	int fd;
	pid_t pid; /* the process whose address space it serves (0: unknown) */
	char name[48];
	char *base; /* the region's address in that process */
};
static struct duffd g_u[16];
static int g_nu;

/* The "store": what D read out before a punch, per page of the region. */
static unsigned char *g_store;      /* npages * PS */
static unsigned char *g_stored;     /* per page: 1 if g_store holds the page */
static int g_minor_continue = 1;    /* answer MINOR faults with UFFDIO_CONTINUE */
static int g_hold_wp = 0;           /* leave WP faults unanswered (eviction in progress) ... */
static unsigned char g_evicting[4096]; /* ... on these pages only, if g_hold_wp == 2 */
static int g_log_faults = 1;
static int g_restore_fd = -1;       /* >= 0: restore by pwrite to this shmem fd + UFFDIO_WAKE */
static int g_peek_syscall = 0;      /* before reading a uffd, print its process's blocked calls */
static long g_nfault_missing, g_nfault_wp, g_nfault_minor, g_eexist;

static int add_uffd(int fd, const char *name, char *base)
{
	g_u[g_nu].fd = fd;
	snprintf(g_u[g_nu].name, sizeof g_u[g_nu].name, "%s", name);
	g_u[g_nu].base = base;
	g_u[g_nu].pid = 0;
	return g_nu++;
}

static void handle_msg(struct duffd *u, struct uffd_msg *m)
{
	static unsigned char zero[PS];
	if (m->event == UFFD_EVENT_PAGEFAULT) {
		uintptr_t a = m->arg.pagefault.address & ~(PS - 1);
		long page = (long)((a - (uintptr_t)u->base) / PS);
		uint64_t fl = m->arg.pagefault.flags;
		const char *kind = fl & UFFD_PAGEFAULT_FLAG_WP      ? "WP"
				   : fl & UFFD_PAGEFAULT_FLAG_MINOR ? "MINOR"
								    : "MISSING";
		if (g_log_faults)
			say("  D: %s fault on uffd of %s, page %ld, %s, tid %u\n", kind, u->name,
			    page, fl & UFFD_PAGEFAULT_FLAG_WRITE ? "write" : "read",
			    m->arg.pagefault.feat.ptid);
		if (fl & UFFD_PAGEFAULT_FLAG_WP) {
			g_nfault_wp++;
			int hold = g_hold_wp == 1 ||
				   (g_hold_wp == 2 && page >= 0 && page < 4096 && g_evicting[page]);
			if (!hold) {
				int e = uffd_wp(u->fd, (void *)a, PS, 0, 0);
				if (e && g_log_faults)
					say("  D: un-WP -> %s\n", strerror(-e));
			}
		} else if (fl & UFFD_PAGEFAULT_FLAG_MINOR) {
			g_nfault_minor++;
			if (g_minor_continue) {
				int e = uffd_continue(u->fd, (void *)a, PS);
				if (g_log_faults)
					say("  D: UFFDIO_CONTINUE -> %s\n", e ? strerror(-e) : "ok");
				if (e)
					uffd_wake(u->fd, (void *)a, PS);
			}
		} else {
			g_nfault_missing++;
			const void *src = (page >= 0 && page < (long)g_npages && g_stored &&
					   g_stored[page])
						  ? g_store + page * PS
						  : zero;
			int e;
			if (g_restore_fd >= 0) {
				e = pwrite(g_restore_fd, src, PS, page * PS) == PS ? 0 : -errno;
				if (g_log_faults)
					say("  D: pwrite of the page into the shmem fd -> %s, then "
					    "UFFDIO_WAKE\n", e ? strerror(-e) : "ok");
				uffd_wake(u->fd, (void *)a, PS);
				return;
			}
			e = uffd_copy(u->fd, (void *)a, src, PS, 0);
			if (e == -EEXIST) {
				g_eexist++;
				uffd_wake(u->fd, (void *)a, PS);
			}
			if (g_log_faults)
				say("  D: UFFDIO_COPY (%s) through %s's uffd -> %s\n",
				    src == zero ? "zeros" : "stored copy", u->name,
				    e ? strerror(-e) : "ok");
		}
	} else if (m->event == UFFD_EVENT_FORK) {
		char nm[48];
		snprintf(nm, sizeof nm, "%.20s's fork child", u->name);
		int i = add_uffd((int)m->arg.fork.ufd, nm, u->base);
		say("  D: UFFD_EVENT_FORK on %s's uffd: new uffd %d\n", u->name, g_u[i].fd);
	} else if (m->event == UFFD_EVENT_REMOVE) {
		say("  D: UFFD_EVENT_REMOVE on %s's uffd: pages %ld..%ld\n", u->name,
		    (long)((m->arg.remove.start - (uintptr_t)u->base) / PS),
		    (long)((m->arg.remove.end - (uintptr_t)u->base) / PS) - 1);
	} else if (m->event == UFFD_EVENT_UNMAP) {
		say("  D: UFFD_EVENT_UNMAP on %s's uffd\n", u->name);
	} else {
		say("  D: event %d on %s's uffd\n", m->event, u->name);
	}
}

/* Read and answer whatever is queued on D's uffds, for up to ms milliseconds. */
static void serve_for(int ms)
{
	double end = now_ms() + ms;
	do {
		struct pollfd pf[16];
		for (int i = 0; i < g_nu; i++)
			pf[i] = (struct pollfd){.fd = g_u[i].fd, .events = POLLIN};
		int left = (int)(end - now_ms());
		if (poll(pf, g_nu, left > 0 ? left : 0) <= 0)
			continue;
		for (int i = 0; i < g_nu; i++)
			if (pf[i].revents & POLLIN) {
				struct uffd_msg m;
				while (read(g_u[i].fd, &m, sizeof m) == sizeof m)
					handle_msg(&g_u[i], &m);
			}
	} while (now_ms() < end);
}

/* What each thread of pid is blocked in (/proc/PID/task/TID/syscall: number and arguments);
 * a thread whose madvise raised a UFFD_EVENT_REMOVE waits there until D reads the event. */
#include <dirent.h>
static void peek_syscalls(pid_t pid)
{
	char path[128], line[256];
	snprintf(path, sizeof path, "/proc/%d/task", pid);
	DIR *d = opendir(path);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%s/syscall", pid, de->d_name);
		FILE *f = fopen(path, "r");
		if (f && fgets(line, sizeof line, f)) {
			line[strcspn(line, "\n")] = 0;
			long nr = atol(line);
			if (nr == SYS_madvise || nr == SYS_fallocate)
				say("  D: before reading the uffd: pid %d tid %s is in syscall %s\n",
				    pid, de->d_name, line);
		}
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
}

/* Send a command to worker w and serve D's uffds until it answers (timeout_ms: give up and
 * return -ETIMEDOUT, leaving the answer to be collected by a later wait_reply). */
static int wait_reply(struct worker *w, struct reply *r, int timeout_ms)
{
	double end = now_ms() + timeout_ms;
	for (;;) {
		struct pollfd pf[17];
		int n = 0;
		pf[n++] = (struct pollfd){.fd = w->rep_r, .events = POLLIN};
		for (int i = 0; i < g_nu; i++)
			pf[n++] = (struct pollfd){.fd = g_u[i].fd, .events = POLLIN};
		int left = (int)(end - now_ms());
		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(pf, n, left) < 0 && errno != EINTR)
			DIE("poll");
		for (int i = 1; i < n; i++)
			if (pf[i].revents & POLLIN) {
				struct uffd_msg m;
				if (g_peek_syscall && g_u[i - 1].pid > 0)
					peek_syscalls(g_u[i - 1].pid);
				while (read(g_u[i - 1].fd, &m, sizeof m) == sizeof m)
					handle_msg(&g_u[i - 1], &m);
			}
		if (pf[0].revents & (POLLIN | POLLHUP)) {
			if (read(w->rep_r, r, sizeof *r) != sizeof *r)
				DIE("worker %s died", w->name);
			return 0;
		}
	}
}

static void send_cmd(struct worker *w, int op, int page, uint64_t val, uint64_t arg)
{
	struct cmd c = {op, page, val, arg};
	if (write(w->cmd_w, &c, sizeof c) != sizeof c)
		DIE("send to %s", w->name);
}

static struct reply call(struct worker *w, int op, int page, uint64_t val, uint64_t arg)
{
	struct reply r;
	send_cmd(w, op, page, val, arg);
	if (wait_reply(w, &r, 20000))
		DIE("%s did not answer op %d within 20 s", w->name, op);
	return r;
}

/* Start P (which maps the region of backing b) and C (P's fork child). memfd_fd_out: P's memfd
 * descriptor number, if any (D can take it with pidfd_getfd). */
static int g_p_memfd = -1;
static void start_workers(enum backing b, size_t npages, int fork_child)
{
	int pp[2][2][2];
	g_nu = 0;
	for (int i = 0; i < 2; i++) {
		if (pipe(pp[i][0]) || pipe(pp[i][1]))
			DIE("pipe");
		g_w[i].name = i ? "C" : "P";
		g_w[i].cmd_r = pp[i][0][0];
		g_w[i].cmd_w = pp[i][0][1];
		g_w[i].rep_r = pp[i][1][0];
		g_w[i].rep_w = pp[i][1][1];
	}
	g_npages = npages;
	free(g_store);
	free(g_stored);
	g_store = calloc(npages, PS);
	g_stored = calloc(npages, 1);
	/* P maps at a fixed address so that D knows it without asking. */
	pid_t pid = fork();
	if (pid == 0) {
		int memfd;
		char *m = map_backing(b, npages, &memfd);
		g_region = mremap(m, npages * PS, npages * PS, MREMAP_MAYMOVE | MREMAP_FIXED,
				  (void *)0x7e0000000000UL);
		if (g_region == MAP_FAILED)
			DIE("mremap");
		if (memfd >= 0 && memfd != 100) {
			dup2(memfd, 100);
			close(memfd);
		}
		g_w[0].pid = getpid();
		worker_loop(&g_w[0]);
		_exit(0);
	}
	g_w[0].pid = pid;
	g_region = (char *)0x7e0000000000UL;
	g_p_memfd = b == MEMFD ? 100 : -1;
	if (fork_child) {
		struct reply r = call(&g_w[0], OP_FORK, 0, 0, 0);
		if (r.r < 0)
			DIE("fork C");
		g_w[1].pid = (pid_t)r.r;
	} else {
		g_w[1].pid = 0;
	}
}

static void stop_workers(void)
{
	for (int i = 1; i >= 0; i--)
		if (g_w[i].pid > 0) {
			send_cmd(&g_w[i], OP_EXIT, 0, 0, 0);
			/* keep serving while it exits */
			double end = now_ms() + 2000;
			int st;
			while (waitpid(g_w[i].pid, &st, WNOHANG) == 0 && now_ms() < end)
				serve_for(5);
			/* C is P's child: reaped by nobody here, fine (init/subreaper) */
		}
	for (int i = 0; i < g_nu; i++)
		close(g_u[i].fd);
	g_nu = 0;
	for (int i = 0; i < 2; i++) {
		close(g_w[i].cmd_r);
		close(g_w[i].cmd_w);
		close(g_w[i].rep_r);
		close(g_w[i].rep_w);
	}
}

/* Have worker w make a uffd (features), register the whole region (mode), and hand it to D. */
static int give_uffd(struct worker *w, uint64_t features, uint64_t mode, uint64_t *granted)
{
	struct reply r = call(w, OP_UFFD, 0, features, mode);
	if (r.r < 0)
		return (int)r.r;
	if (granted)
		*granted = r.val;
	int fd = pidfd_getfd_of(w->pid, (int)r.r);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	int i = add_uffd(fd, w->name, g_region);
	g_u[i].pid = w->pid;
	return fd;
}

/* A finding, printed as "RESULT: ...". */
static void result(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("RESULT: ");
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	va_end(ap);
}

#include <sys/prctl.h>
static void probe_init(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	setvbuf(stdout, NULL, _IOLBF, 0);
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	if (geteuid() != 0)
		say("warning: not root; map_files and pidfd_getfd need it\n");
}
static void reap_all(void)
{
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}
