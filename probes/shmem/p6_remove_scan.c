/* p6: telling MADV_REMOVE from MADV_DONTNEED in a UFFD_EVENT_REMOVE by reading the blocked
 * caller's /proc/PID/task/TID/syscall before the event is read (finding 9, issue #16).
 *
 * D (this process, root) holds the uffd of P (a child mapping 256 pages MAP_SHARED|MAP_ANONYMOUS,
 * registered MISSING with EVENT_REMOVE; taken with pidfd_getfd). Whenever that uffd is readable
 * D first reads the syscall file of every thread of P (and of P's CLONE_VM children, found by
 * kcmp(KCMP_VM)), then reads the messages, and matches each REMOVE to a thread blocked in
 * madvise (nr 28) or process_madvise (nr 440) whose range covers it.
 *
 * Steps of P (each a RESULT line): libc madvise DONTNEED; raw syscall MADV_REMOVE;
 * process_madvise(pidfd of self, 2 iovecs, MADV_REMOVE); a clone(CLONE_VM) child's raw
 * MADV_REMOVE; a vfork child's; 4 threads x ROUNDS rounds of concurrent madvise (REMOVE on even
 * pages, DONTNEED on odd ones: D checks its classification against that); the cost of a scan
 * for 1, 16 and 64 threads.
 *
 *     ./p6_remove_scan [ROUNDS]     (root; default 2000)
 */
#include "common.h"
#include <dirent.h>
#include <linux/kcmp.h>
#include <sched.h>

#define NP 256
#define NTHR 4
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif

static int rounds = 2000;

/* ---- P ------------------------------------------------------------------------------------ */
static char *g_map;
static pthread_barrier_t g_bar;
static int g_ctl[2], g_ack[2]; /* P -> D control bytes, D -> P acks */

static void ctl(char c)
{
	if (write(g_ctl[1], &c, 1) != 1)
		DIE("ctl");
	if (read(g_ack[0], &c, 1) != 1)
		DIE("ack");
}

static void *madv_thread(void *arg)
{
	long i = (long)arg;
	for (int r = 0; r < rounds; r++) {
		pthread_barrier_wait(&g_bar);
		/* even thread index: MADV_REMOVE, odd: MADV_DONTNEED; page 64 + i */
		int adv = (i % 2 == 0) ? MADV_REMOVE : MADV_DONTNEED;
		if (syscall(SYS_madvise, g_map + (64 + i) * PS, PS, adv))
			DIE("madvise thread");
	}
	return NULL;
}

static void *idle_thread(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static int clone_child(void *arg)
{
	(void)arg;
	syscall(SYS_madvise, g_map + 5 * PS, PS, MADV_REMOVE);
	return 0;
}

static void program(int pipefd)
{
	g_map = mmap(NULL, NP * PS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (g_map == MAP_FAILED)
		DIE("mmap");
	memset(g_map, 0xA5, NP * PS);
	int uffd = uffd_new(UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_MISSING_SHMEM, NULL);
	if (uffd < 0)
		DIE("uffd %d", uffd);
	if (uffd_register(uffd, g_map, NP * PS, UFFDIO_REGISTER_MODE_MISSING, NULL))
		DIE("register");
	uint64_t msg[2] = {(uint64_t)uffd, (uint64_t)(uintptr_t)g_map};
	if (write(pipefd, msg, sizeof msg) != sizeof msg)
		DIE("write");
	ctl('s'); /* D has the uffd */

	ctl('1');
	madvise(g_map + 0 * PS, PS, MADV_DONTNEED);
	ctl('2');
	syscall(SYS_madvise, g_map + 1 * PS, PS, MADV_REMOVE);
	ctl('3');
	int self = syscall(SYS_pidfd_open, getpid(), 0);
	struct iovec iov[2] = {{g_map + 2 * PS, PS}, {g_map + 4 * PS, PS}};
	long r = syscall(SYS_process_madvise, self, iov, 2, MADV_REMOVE, 0);
	say("P: process_madvise(pidfd of self, 2 iovecs, MADV_REMOVE) -> %ld (%s)\n", r,
	    r < 0 ? strerror(errno) : "ok");
	ctl('4');
	static char stack[64 * 1024];
	pid_t c = clone(clone_child, stack + sizeof stack, CLONE_VM | SIGCHLD, NULL);
	if (c < 0)
		DIE("clone");
	waitpid(c, NULL, 0);
	ctl('5');
	c = vfork();
	if (c == 0) {
		syscall(SYS_madvise, g_map + 6 * PS, PS, MADV_REMOVE);
		_exit(0);
	}
	waitpid(c, NULL, 0);
	ctl('6');
	pthread_t t[NTHR];
	pthread_barrier_init(&g_bar, NULL, NTHR);
	for (long i = 0; i < NTHR; i++)
		pthread_create(&t[i], NULL, madv_thread, (void *)i);
	for (int i = 0; i < NTHR; i++)
		pthread_join(t[i], NULL);
	ctl('7');
	/* the cost of a scan: 1 thread (P alone, waiting in read), then 16, then 64 */
	ctl('c');
	pthread_t idle;
	for (int i = 0; i < 15; i++)
		pthread_create(&idle, NULL, idle_thread, NULL);
	ctl('c');
	for (int i = 0; i < 48; i++)
		pthread_create(&idle, NULL, idle_thread, NULL);
	ctl('c');
	ctl('q');
	_exit(0);
}

/* ---- D ------------------------------------------------------------------------------------ */
struct th {
	int tid;
	long nr; /* -2: "running" or unreadable */
	uint64_t a[6];
};

static int scan_one(int pid, int tid, struct th *o)
{
	char path[96], buf[256];
	snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", pid, tid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	o->tid = tid;
	o->nr = -2;
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	if (!strncmp(buf, "running", 7))
		return 0;
	char *p = buf;
	o->nr = strtol(p, &p, 10);
	for (int i = 0; i < 6 && o->nr >= 0; i++)
		o->a[i] = strtoull(p, &p, 16);
	return 0;
}

/* Every thread of pid, and (with kids) of the processes sharing its mm among its children. */
static int scan(int pid, struct th *out, int max, int kids)
{
	char path[64];
	int n = 0;
	snprintf(path, sizeof path, "/proc/%d/task", pid);
	DIR *d = opendir(path);
	if (!d)
		return 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max) {
		if (e->d_name[0] == '.')
			continue;
		int tid = atoi(e->d_name);
		scan_one(pid, tid, &out[n++]);
		if (!kids)
			continue;
		char cp[96], cb[512];
		snprintf(cp, sizeof cp, "/proc/%d/task/%d/children", pid, tid);
		int fd = open(cp, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t k = read(fd, cb, sizeof cb - 1);
		close(fd);
		cb[k > 0 ? k : 0] = 0;
		for (char *s = cb; *s && n < max;) {
			int c = strtol(s, &s, 10);
			if (c <= 0)
				break;
			if (syscall(SYS_kcmp, pid, c, KCMP_VM, 0, 0) == 0)
				scan_one(c, c, &out[n++]);
		}
	}
	closedir(d);
	return n;
}

static int g_memfd = -1;

/* The state letter of /proc/TID/stat (after the last ')'). */
static char state_of(int tid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", tid);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return '?';
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return '?';
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] && p[2] ? p[2] : '?';
}

static void wchan_of(int tid, char *out, size_t len)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/wchan", tid);
	int fd = open(path, O_RDONLY);
	ssize_t n = fd < 0 ? -1 : read(fd, out, len - 1);
	if (fd >= 0)
		close(fd);
	out[n > 0 ? n : 0] = 0;
}

/* ns per call of f over every thread of pid, reps times */
static double per_thread_ns(int pid, int which, int reps, int *nthreads)
{
	char path[64], buf[512];
	int tids[512], n = 0;
	snprintf(path, sizeof path, "/proc/%d/task", pid);
	DIR *d = opendir(path);
	struct dirent *e;
	while (d && (e = readdir(d)) && n < 512)
		if (e->d_name[0] != '.')
			tids[n++] = atoi(e->d_name);
	if (d)
		closedir(d);
	int fds[512];
	const char *file = which == 0 ? "syscall" : which == 1 ? "stat" : "wchan";
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof path, "/proc/%d/task/%d/%s", pid, tids[i], file);
		fds[i] = open(path, O_RDONLY);
	}
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int r = 0; r < reps; r++)
		for (int i = 0; i < n; i++)
			if (pread(fds[i], buf, sizeof buf, 0) < 0)
				DIE("pread %s", file);
	clock_gettime(CLOCK_MONOTONIC, &b);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	*nthreads = n;
	return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / reps / n;
}

/* The advice a scanned thread is removing [s, e) with: 9 MADV_REMOVE, 4 MADV_DONTNEED,
 * -1 none found. */
static int match(struct th *t, int n, uint64_t s, uint64_t e, int *who)
{
	for (int i = 0; i < n; i++) {
		if (t[i].nr == SYS_madvise) {
			uint64_t a = t[i].a[0], l = t[i].a[1];
			if (a <= s && e <= a + l) {
				*who = t[i].tid;
				return (int)t[i].a[2];
			}
		} else if (t[i].nr == SYS_process_madvise) {
			struct iovec v[8];
			size_t vlen = t[i].a[2] < 8 ? t[i].a[2] : 8;
			if (pread(g_memfd, v, vlen * sizeof v[0], (off_t)t[i].a[1]) !=
			    (ssize_t)(vlen * sizeof v[0]))
				continue;
			for (size_t k = 0; k < vlen; k++) {
				uint64_t a = (uintptr_t)v[k].iov_base, l = v[k].iov_len;
				if (a <= s && e <= a + l) {
					*who = t[i].tid;
					return (int)t[i].a[3];
				}
			}
		}
	}
	return -1;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		rounds = atoi(argv[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	say("kernel: ");
	fflush(stdout);
	if (system("uname -r"))
		return 2;
	int pp[2];
	if (pipe(pp) || pipe(g_ctl) || pipe(g_ack))
		DIE("pipe");
	pid_t P = fork();
	if (P == 0)
		program(pp[1]);
	uint64_t msg[2];
	if (read(pp[0], msg, sizeof msg) != sizeof msg)
		DIE("read");
	int pidfd = syscall(SYS_pidfd_open, P, 0);
	int uffd = syscall(SYS_pidfd_getfd, pidfd, (int)msg[0], 0);
	if (uffd < 0)
		DIE("pidfd_getfd");
	char *map = (char *)(uintptr_t)msg[1];
	char mp[64];
	snprintf(mp, sizeof mp, "/proc/%d/mem", P);
	g_memfd = open(mp, O_RDONLY);

	static struct th t[512];
	char step = 0;
	long ev = 0, matched = 0, wrong = 0, unmatched = 0, late = 0;
	long batch_multi = 0, scans = 0;
	double scan_ns = 0;
	int done = 0;
	while (!done) {
		struct pollfd pfd[2] = {{uffd, POLLIN, 0}, {g_ctl[0], POLLIN, 0}};
		if (poll(pfd, 2, 5000) <= 0)
			DIE("poll timeout at step %c", step);
		if (pfd[0].revents & POLLIN) {
			struct timespec a, b;
			clock_gettime(CLOCK_MONOTONIC, &a);
			int n = scan(P, t, 512, 1);
			clock_gettime(CLOCK_MONOTONIC, &b);
			scan_ns += (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
			scans++;
			if (step != '6')
				for (int i = 0; i < n; i++) {
					char w[96], st = state_of(t[i].tid);
					wchan_of(t[i].tid, w, sizeof w);
					say("  D scan before read: tid %d: nr %ld args %#lx %#lx %#lx %#lx; "
					    "stat state %c, wchan %s\n",
					    t[i].tid, t[i].nr, (long)t[i].a[0], (long)t[i].a[1],
					    (long)t[i].a[2], (long)t[i].a[3], st, w);
				}
			struct uffd_msg m[16];
			ssize_t r = read(uffd, m, sizeof m);
			if (r < 0 && errno == EAGAIN)
				continue;
			if (r < 0)
				DIE("read uffd");
			int k = r / sizeof m[0];
			if (k > 1)
				batch_multi++;
			for (int i = 0; i < k; i++) {
				if (m[i].event != UFFD_EVENT_REMOVE) {
					say("  D: event %#x\n", m[i].event);
					continue;
				}
				uint64_t s = m[i].arg.remove.start, e = m[i].arg.remove.end;
				int who = 0, adv = match(t, n, s, e, &who);
				long pg = (long)((s - (uintptr_t)map) / PS);
				ev++;
				if (step == '6') {
					int truth = ((pg - 64) % 2 == 0) ? MADV_REMOVE : MADV_DONTNEED;
					if (adv < 0) {
						unmatched++;
						struct th t2[512];
						int n2 = scan(P, t2, 512, 0);
						if (match(t2, n2, s, e, &who) >= 0)
							late++;
					} else if (adv == truth) {
						matched++;
					} else {
						wrong++;
					}
				} else {
					say("  D: REMOVE of page %ld (%ld pages): scan says advice %d (tid %d)\n",
					    pg, (long)((e - s) / PS), adv, who);
				}
			}
		}
		if (pfd[1].revents & POLLIN) {
			if (read(g_ctl[0], &step, 1) != 1)
				DIE("ctl read");
			switch (step) {
			case '2':
				result("libc madvise(MADV_DONTNEED) of 1 page (lines above): advice 4 seen");
				break;
			case '3':
				result("raw syscall(SYS_madvise, MADV_REMOVE) of 1 page (lines above)");
				break;
			case '4':
				result("process_madvise on self (lines above)");
				break;
			case '5':
				result("a clone(CLONE_VM) child's raw MADV_REMOVE: found among P's "
				       "children by kcmp(KCMP_VM) (lines above; not in /proc/P/task)");
				break;
			case '6':
				result("a vfork child's raw MADV_REMOVE (lines above)");
				scans = 0;
				scan_ns = 0;
				break;
			case '7':
				result("%d threads x %d rounds of concurrent madvise (REMOVE on even, "
				       "DONTNEED on odd pages): %ld REMOVE events, %ld told right by the "
				       "scan before their read, %ld told wrong, %ld not found by it (%ld "
				       "of those found by a scan after the read); %ld of %ld reads "
				       "returned more than one message; a scan of %d threads took %.1f us "
				       "on average",
				       NTHR, rounds, ev, matched, wrong, unmatched, late, batch_multi,
				       scans, NTHR + 1, scans ? scan_ns / scans / 1e3 : 0.0);
				break;
			case 'c': {
				struct timespec a, b;
				int n = 0, reps = 2000;
				clock_gettime(CLOCK_MONOTONIC, &a);
				for (int i = 0; i < reps; i++)
					n = scan(P, t, 512, 0);
				clock_gettime(CLOCK_MONOTONIC, &b);
				double own = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / reps;
				clock_gettime(CLOCK_MONOTONIC, &a);
				for (int i = 0; i < reps; i++)
					n = scan(P, t, 512, 1);
				clock_gettime(CLOCK_MONOTONIC, &b);
				double kids = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / reps;
				result("cost of one scan of P's %d threads (all asleep): %.1f us (%.2f us a "
				       "thread); with the children files and kcmp: %.1f us",
				       n, own / 1e3, own / 1e3 / n, kids / 1e3);
				int nt;
				double sc = per_thread_ns(P, 0, reps, &nt), stt = per_thread_ns(P, 1, reps, &nt),
				       wc = per_thread_ns(P, 2, reps, &nt);
				result("files kept open, one pread a thread (%d threads): syscall %.2f us, "
				       "stat %.2f us, wchan %.2f us",
				       nt, sc / 1e3, stt / 1e3, wc / 1e3);
				break;
			}
			case 'q':
				done = 1;
				break;
			}
			if (write(g_ack[1], &step, 1) != 1)
				DIE("ack");
		}
	}
	kill(P, SIGKILL);
	waitpid(P, NULL, 0);
	return 0;
}
