/*
 * uffd-agent: the small part of uffd-daemon that runs inside each managed process.
 *
 * Loaded with LD_PRELOAD by `uffd-daemon run`. Its constructor creates the process's
 * userfaultfd, hands it to the daemon over a Unix socket (SCM_RIGHTS) and starts one thread
 * that carries out the daemon's batched page drops. It is C rather than Rust because it lives
 * inside arbitrary programs: no second runtime or allocator, nothing but a few syscalls.
 *
 * Why the agent exists (DESIGN.md): no other process can drop a page of the client, and
 * UFFDIO_MOVE only works from inside the client's address space. A drop moves each victim page
 * with UFFDIO_MOVE into the agent's own registered scratch area (the kernel refuses a page
 * pinned for I/O), and frees the scratch with MADV_DONTNEED once the daemon has read back what
 * moved (FREE). Moving produces no UFFD_EVENT_REMOVE for the victim, so every REMOVE event the
 * daemon sees on program memory is the program's own (an unambiguous attribution), and the
 * scratch area's REMOVE events are recognised by their address.
 *
 * The agent thread touches only memory the daemon never manages: its stack and state live in
 * the agent region it reports in its greeting, and it calls the kernel through syscall(2) only,
 * never through libc wrappers (sendmsg(), close() and the like read libc's .bss to decide
 * whether they are cancellation points, and that .bss is anonymous memory the daemon pages;
 * syscall(2) itself touches nothing but errno, in the thread's TLS on its own stack);
 * the library is linked with -z now so that no lazy binding walks the dynamic linker's
 * (anonymous, paged) link maps either. So it keeps running when the program's pages are
 * evicted: a fault of its own would wait for the very reclaim that waits for its answer. The
 * daemon learns the thread's id from one fault on the first scratch page (see agent_thread)
 * and counts any other fault of it as `agent_faults` (tested to stay 0). If the daemon dies
 * (its socket closes and its lifeline hangs up) the thread stops the whole process at once
 * with a clear message instead of letting it read evicted pages as zeros.
 *
 * The daemon's end is seen on its lifeline: the read end of a pipe whose write end only the
 * daemon holds, handed over with the answer to each greeting; it hangs up (POLLHUP) when the
 * daemon exits. Never by the daemon's pid number: in a pid namespace below the daemon's
 * (unshare -pf, bwrap --unshare-pid, a rootless container) that number names nothing, or
 * another process. (Not by a pidfd of the daemon either: that would give a sandboxed process a
 * handle to signal the daemon across its pid namespace; the pipe tells only that it ended.)
 *
 * Fork: the kernel hands the child's new uffd to the daemon (UFFD_EVENT_FORK). In the child an
 * atfork handler touches the probe page (wipe-on-fork: empty in every child, so it always
 * faults); while it waits in that fault, the daemon writes random bytes there through the
 * child's uffd and finds the process whose probe page holds them (the fault's thread id, a
 * number of the child's own pid namespace, only narrows the search). The new agent thread then
 * greets the daemon and receives the child's uffd and the daemon's lifeline; the probe page is
 * emptied after that. Every other thread of the parent is gone in the child, as POSIX says.
 *
 * Inspection: the kernel reads a process's memory without a userfault for a core dump and for a
 * debugger (/proc/PID/mem, PTRACE_PEEKDATA), so evicted pages would read as zeros or EIO. The
 * agent handles the core-dumping signals the program leaves at their default action and asks
 * the daemon to bring every page back before the core is written (see "Core dumps" below), and
 * a tracer with the agent asks the same before it attaches (see ptrace()); the daemon's hold.rs
 * does the rest, and sees tracers from outside the tree in /proc.
 *
 * Protocol: see crates/uffd-daemon/src/protocol.rs; the constants below mirror it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <ucontext.h>
#include <unistd.h>

/*
 * The agent's own system calls, without glibc's syscall(): the agent interposes syscall() (and
 * prctl()) to learn when the program installs a seccomp filter, and must not go through its own
 * wrapper. Same contract as syscall(2): -1 and errno on failure. errno is the calling thread's
 * (the agent threads' TLS lives on their stacks, in the agent region).
 */
static long agent_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
	long r;
#if defined(__x86_64__)
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;
	__asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
	r = x0;
#else
#error "the agent's raw system calls are written for x86_64 and aarch64"
#endif
	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

#define AGENT_SYSCALL_N(n, a, b, c, d, e, f, ...) agent_syscall6((long)(n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))
#define agent_syscall(...) AGENT_SYSCALL_N(__VA_ARGS__, 0, 0, 0, 0, 0, 0, 0)
#define syscall agent_syscall

#include "uffd_protocol.h" /* the wire protocol's constants, generated from src/wire.rs */

#define PAGE 4096UL

#define SCRATCH_PAGES 512UL
_Static_assert(SCRATCH_PAGES <= MAX_DROP_PAGES, "a DROP names at most MAX_DROP_PAGES pages");
#define GREETING_TIMEOUT_S 10
#define STACK_BYTES (256UL * 1024)
#define WATCHDOG_STACK_BYTES (1024UL * 1024) /* it may run the program's atexit handlers */

/* uapi bits the Debian 12 headers lack. */
#define PIDFD_THREAD_ O_EXCL
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
struct uffdio_api_ { uint64_t api, features, ioctls; };
struct uffdio_range_ { uint64_t start, len; };
struct uffdio_register_ { struct uffdio_range_ range; uint64_t mode, ioctls; };
struct uffdio_move_ { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_API_ _IOWR(0xAA, 0x3F, struct uffdio_api_)
#define UFFDIO_REGISTER_ _IOWR(0xAA, 0x00, struct uffdio_register_)
#define UFFDIO_MOVE_ _IOWR(0xAA, 0x05, struct uffdio_move_)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES (1ULL << 1)
/* capset(2)'s header and data (<linux/capability.h>). */
struct cap_header_ { uint32_t version; int pid; };
struct cap_data_ { uint32_t effective, permitted, inheritable; };
#define CAP_VERSION_1_ 0x19980330 /* one cap_data_; versions 2 and 3 take two */

/*
 * A change a program thread made to its own credentials, for the agent's threads to make too
 * (see "Per-thread credentials" below): capset(2) or one of prctl's credential options.
 */
struct cred_change {
	long nr;                    /* SYS_capset or SYS_prctl */
	long arg[5];                /* prctl's arguments */
	uint32_t version;           /* capset: the header's version (the pid is the caller: 0) */
	struct cap_data_ data[2];   /* capset: its data (one for version 1) */
};

enum { CRED_AGENT, CRED_WATCHDOG }; /* the agent's two threads, as indices below */

struct cred_follow {
	volatile int owner;         /* futex, the lock: the program thread holding it, 0 if none */
	volatile uint32_t seq;      /* seqlock over `change`: odd while it is written */
	struct cred_change change;  /* the latest change */
	volatile uint32_t done[2];  /* the `seq` each agent thread has made (or tried) */
	volatile int err[2];        /* the errno of that try, 0 if it succeeded */
	volatile int acks;          /* futex: bumped after each try */
	volatile int wake_fd[2];    /* each thread's eventfd, in its own descriptor table (-1) */
	volatile int wait_ms;       /* the agent thread's poll timeout: -1 if it can be woken */
	volatile int up;            /* futex: the watchdog has set its wake_fd */
	pid_t pid;                  /* the process the agent's threads belong to */
	volatile int said;          /* a failure was said on stderr (once) */
};

struct agent {
	int sock;            /* connection to the daemon (in the agent thread's own fd table) */
	int uffd;            /* this process's userfaultfd (ditto; kept open: see header comment) */
	pid_t daemon_pid;    /* the daemon's pid in its own pid namespace: see daemon_pid_ok */
	/* The daemon's lifeline (see the header comment) from the answer to the greeting: in the
	 * agent thread's own table once it has it (-1 before), where the watchdog takes a copy of it
	 * for its own (pidfd_getfd through a thread pidfd). */
	volatile int lifeline;
	/* The constructor's copy of it, in the program's table while the agent's threads start
	 * (each keeps it in its own table; then the constructor closes it): -1 otherwise. */
	int boot_lifeline;
	/* Whether `daemon_pid` means the daemon here: this process is in the daemon's pid namespace
	 * (then the number is a fallback where no lifeline came). Set by the thread starting the
	 * agent's threads, for the process it is in. */
	int daemon_pid_ok;
	char daemon_pidns[48]; /* the daemon's pid namespace (UFFD_DAEMON_PIDNS: "pid:[INODE]") */
	volatile int tid;    /* the agent thread's id, once it has its own fd table (0 before) */
	volatile int ready;  /* futex: 1 once the agent thread has its own fd table, -1 if it failed */
	volatile int greeted; /* futex: a fork child's agent greeted the daemon (1) or could not (-1) */
	volatile int agent_running; /* the agent thread has started and not yet returned */
	volatile int filtered; /* the program installed a seccomp filter: no agent work in its threads */
	volatile int leaving; /* the process leaves management (a TSYNC filter): the agent's threads end */
	volatile int closing; /* the daemon closes the agent's connection on purpose (a step-out) */
	volatile int stepping_out; /* the agent's threads end for a call that needs the process alone */
	uint32_t greet_flags; /* what a thread that greets itself says: HELLO_FORK_CHILD or _AGENT_RESTART */
	volatile int watchdog_tid; /* the watchdog thread's id (0 before it runs or after it ends) */
	volatile int lock_future; /* mlockall(MCL_FUTURE): every new mapping is locked at birth */
	struct cred_follow cred; /* the program's credential changes, for the agent's threads */
	int fork_child;      /* started by atfork_child or after a step-out: greets the daemon itself */
	uint64_t features;
	char *region;
	char *probe;
	char *scratch;
	uint64_t scratch_used; /* pages of the scratch that DROPs may have moved into, not yet freed */
	char *stack;
	char *watchdog_stack;
	uint8_t buf[MAX_PACKET];
	uint8_t out[MAX_PACKET];
};

/* Region layout: [probe page][scratch pages][agent state][agent stack][watchdog stack] */
#define STATE_BYTES ((sizeof(struct agent) + PAGE - 1) & ~(PAGE - 1))
#define REGION_BYTES (PAGE + SCRATCH_PAGES * PAGE + STATE_BYTES + STACK_BYTES + WATCHDOG_STACK_BYTES)

/* Set once by the constructor, read by the atfork handlers (program threads only). */
static struct agent *g_agent;
/* The agent's changes of the program's signal dispositions, one at a time (see "Core dumps"). */
static volatile int g_sig_lock;
static char g_sock_path[108];

static void say(const char *msg)
{
	/* write(2) only: safe in any context, no allocation. */
	size_t n = strlen(msg);
	while (n > 0) {
		ssize_t w = write(2, msg, n);
		if (w <= 0)
			break;
		msg += w;
		n -= (size_t)w;
	}
}

static void fatal(const char *what, int err)
{
	char line[256];
	snprintf(line, sizeof line, "uffd-agent[%d]: %s: %s; stopping this process\n", (int)getpid(), what,
		 err ? strerror(err) : "failed");
	say(line);
	_exit(EXIT_DAEMON_LOST);
}

/*
 * Stops the process without touching any memory the daemon manages: raw syscalls, the
 * caller's stack (which lives in the agent region) and read-only strings only. Used when the
 * daemon is gone, when every page of libc's .bss or the heap may be evicted for good.
 */
static void die_daemon_lost(void)
{
	static const char head[] = "uffd-agent[";
	static const char tail[] = "]: the uffd-daemon serving this process died; stopping this process "
				   "rather than running on without its evicted pages\n";
	char num[16];
	int n = 0;
	long pid = syscall(SYS_getpid);
	char tmp[16];
	int t = 0;
	do {
		tmp[t++] = (char)('0' + pid % 10);
		pid /= 10;
	} while (pid > 0 && t < 15);
	while (t > 0)
		num[n++] = tmp[--t];
	/* The agent's threads have no descriptors of the program's: borrow its stderr. */
	long err = -1;
	long pfd = syscall(SYS_pidfd_open, syscall(SYS_getpid), 0);
	if (pfd >= 0)
		err = syscall(SYS_pidfd_getfd, pfd, 2, 0);
	if (err < 0)
		err = 2;
	/* One write (under PIPE_BUF): the processes of a tree die at once when their daemon does,
	 * and three writes each interleaved their messages on a shared stderr. */
	char line[sizeof head + sizeof num + sizeof tail];
	memcpy(line, head, sizeof head - 1);
	memcpy(line + sizeof head - 1, num, (size_t)n);
	memcpy(line + sizeof head - 1 + n, tail, sizeof tail - 1);
	syscall(SYS_write, err, line, sizeof head - 1 + n + sizeof tail - 1);
	syscall(SYS_exit_group, EXIT_DAEMON_LOST);
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static size_t header_seq(uint8_t *out, uint16_t kind, uint32_t len, uint32_t seq)
{
	put32(out, MAGIC);
	uint16_t v = VERSION;
	memcpy(out + 4, &v, 2);
	memcpy(out + 6, &kind, 2);
	put32(out + 8, len);
	put32(out + 12, seq);
	return HEADER_LEN;
}

static size_t header(uint8_t *out, uint16_t kind, uint32_t len)
{
	return header_seq(out, kind, len, 0);
}

static uint64_t now_us(void)
{
	struct timespec ts;
	syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int send_packet(int sock, const uint8_t *data, size_t len, int fd)
{
	struct iovec iov = { (void *)data, len };
	union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } c;
	struct msghdr m = { 0 };
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (fd >= 0) {
		memset(&c, 0, sizeof c);
		m.msg_control = c.b;
		m.msg_controllen = sizeof c.b;
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(h), &fd, sizeof(int));
	}
	for (;;) {
		ssize_t n = syscall(SYS_sendmsg, sock, &m, MSG_NOSIGNAL);
		if (n >= 0)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

/* Receives one packet and the descriptors it carries, in order: up to `max` of them into
 * `fds` (their count in `*nfds`), any more closed. */
static ssize_t recv_packet_fds(int sock, uint8_t *buf, size_t cap, int *fds, int max, int *nfds)
{
	struct iovec iov = { buf, cap };
	union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int) * 4)]; } c;
	struct msghdr m = { 0 };
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = c.b;
	m.msg_controllen = sizeof c.b;
	ssize_t n;
	do {
		n = syscall(SYS_recvmsg, sock, &m, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	int got = 0;
	if (n > 0) {
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < count; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
				if (got < max)
					fds[got++] = fd;
				else
					syscall(SYS_close, fd);
			}
		}
	}
	if (nfds)
		*nfds = got;
	return n;
}

/* Receives one packet; its first descriptor into `*fd_out` (-1 if none; NULL: closed), any
 * other closed. */
static ssize_t recv_packet(int sock, uint8_t *buf, size_t cap, int *fd_out)
{
	int fd = -1, nfd = 0;
	ssize_t n = recv_packet_fds(sock, buf, cap, &fd, fd_out ? 1 : 0, &nfd);
	if (fd_out)
		*fd_out = nfd > 0 ? fd : -1;
	return n;
}

/* Returns the payload of a valid packet of `kind`, or NULL. */
static const uint8_t *check_packet(const uint8_t *buf, ssize_t n, uint16_t kind, uint32_t *len)
{
	if (n < HEADER_LEN || get32(buf) != MAGIC)
		return NULL;
	uint16_t v, k;
	memcpy(&v, buf + 4, 2);
	memcpy(&k, buf + 6, 2);
	uint32_t l = get32(buf + 8);
	if (v != VERSION || (ssize_t)l != n - HEADER_LEN)
		return NULL;
	if (k == KIND_ERROR && l >= 4) {
		char msg[512];
		size_t ml = l - 4 < sizeof msg - 1 ? l - 4 : sizeof msg - 1;
		memcpy(msg, buf + HEADER_LEN + 4, ml);
		msg[ml] = 0;
		say("uffd-agent: the daemon refused this process: ");
		say(msg);
		say("\n");
		return NULL;
	}
	if (k != kind)
		return NULL;
	*len = l;
	return buf + HEADER_LEN;
}

static int connect_daemon(void)
{
	/* Raw syscalls: a fork child's agent thread connects (it may touch managed memory then,
	 * since no DROP comes before it has named itself, but it need not). */
	int s = (int)syscall(SYS_socket, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	memcpy(a.sun_path, g_sock_path, sizeof a.sun_path);
	if (syscall(SYS_connect, s, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = errno;
		syscall(SYS_close, s);
		errno = e;
		return -1;
	}
	return s;
}

/* Greets the daemon with `flags` (and `send_fd`, if not -1) and waits for its answer. The
 * answer carries the descriptor it hands this process, if `recv_fd` asks for one (its uffd, or
 * the device), and then, if `recv_lifeline` asks for it, the daemon's lifeline: each -1 if it did not
 * come. 0 if the daemon accepted the greeting. */
static int hello(struct agent *ag, uint32_t flags, int send_fd, int *recv_fd, int *recv_lifeline)
{
	if (recv_fd)
		*recv_fd = -1;
	if (recv_lifeline)
		*recv_lifeline = -1;
	uint8_t pkt[HEADER_LEN + 64];
	memset(pkt, 0, sizeof pkt);
	header(pkt, KIND_HELLO, 64);
	uint8_t *p = pkt + HEADER_LEN;
	put32(p + 0, (uint32_t)syscall(SYS_getpid));
	put32(p + 4, (uint32_t)syscall(SYS_getppid));
	put32(p + 8, flags);
	put64(p + 16, ag->features);
	put64(p + 24, (uint64_t)ag->region);
	put64(p + 32, REGION_BYTES);
	put64(p + 40, (uint64_t)ag->probe);
	put64(p + 48, (uint64_t)ag->scratch);
	put32(p + 56, SCRATCH_PAGES);
	if (send_packet(ag->sock, pkt, sizeof pkt, send_fd) < 0)
		return -1;
	/* The answer comes within GREETING_TIMEOUT_S or never: a daemon that cannot answer (out of
	 * descriptors, stopped) must not hang the program's start or its fork. */
	struct timeval tv = { .tv_sec = GREETING_TIMEOUT_S, .tv_usec = 0 };
	syscall(SYS_setsockopt, ag->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	int fds[2], nfd = 0;
	ssize_t n = recv_packet_fds(ag->sock, ag->buf, sizeof ag->buf, fds, 2, &nfd);
	int recv_errno = errno;
	struct timeval none = { 0, 0 };
	syscall(SYS_setsockopt, ag->sock, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
	int k = 0;
	if (recv_fd && k < nfd)
		*recv_fd = fds[k++];
	if (recv_lifeline && k < nfd)
		*recv_lifeline = fds[k++];
	while (k < nfd)
		syscall(SYS_close, fds[k++]);
	int err = 0;
	uint32_t len;
	const uint8_t *ack = NULL;
	if (n < 0 && (recv_errno == EAGAIN || recv_errno == EWOULDBLOCK))
		err = ETIMEDOUT;
	else if (!(ack = check_packet(ag->buf, n, KIND_HELLO_ACK, &len)) || len != 8)
		err = EPROTO;
	else if ((int32_t)get32(ack) != 0)
		err = (int32_t)get32(ack) > 0 ? (int)get32(ack) : EPROTO;
	if (err) {
		if (recv_fd && *recv_fd >= 0)
			syscall(SYS_close, *recv_fd);
		if (recv_lifeline && *recv_lifeline >= 0)
			syscall(SYS_close, *recv_lifeline);
		if (recv_fd)
			*recv_fd = -1;
		if (recv_lifeline)
			*recv_lifeline = -1;
		errno = err;
		return -1;
	}
	return 0;
}

/* Makes the pages of [addr, addr + pages) that are present the process's own again: a write
 * fault without the write (MADV_POPULATE_WRITE) reuses a page no other process maps any more
 * and copies one that a forked child still shares, as the program's own write would. Pages
 * not present (the program removed them since) are left alone: populating them would put
 * pages into memory the program freed. Per-page status: 0, or an errno. */
static void do_unshare(uint64_t addr, uint32_t pages, uint8_t *status)
{
	unsigned char vec[MAX_DROP_PAGES];
	if (syscall(SYS_mincore, addr, (uint64_t)pages * PAGE, vec) != 0) {
		int e = errno ? errno : EIO;
		memset(status, e > 255 ? 255 : e, pages);
		return;
	}
	uint32_t i = 0;
	while (i < pages) {
		if (!(vec[i] & 1)) {
			status[i++] = ENOENT;
			continue;
		}
		uint32_t j = i;
		while (j < pages && (vec[j] & 1))
			j++;
		int e = 0;
		if (syscall(SYS_madvise, addr + (uint64_t)i * PAGE, (uint64_t)(j - i) * PAGE, 23 /* MADV_POPULATE_WRITE */) != 0)
			e = errno ? errno : EIO;
		memset(status + i, e > 255 ? 255 : e, j - i);
		i = j;
	}
}

/* Frees what DROPs moved into the scratch (FREE: the daemon has read it all back). The
 * scratch's REMOVE event is recognised by its address. */
static void free_scratch(struct agent *ag)
{
	if (ag->scratch_used > 0)
		syscall(SYS_madvise, ag->scratch, ag->scratch_used * PAGE, MADV_DONTNEED);
	ag->scratch_used = 0;
}

/* Answers a DROP (or a FREE: no status) with its sequence number: `n` statuses, already in
 * place after the header, and the scratch page the DROP's pages start at. */
static void send_done(struct agent *ag, uint32_t seq, uint32_t n, uint32_t base)
{
	header_seq(ag->out, KIND_DROP_DONE, 8 + n, seq);
	put32(ag->out + HEADER_LEN, n);
	put32(ag->out + HEADER_LEN + 4, base);
	if (send_packet(ag->sock, ag->out, HEADER_LEN + 8 + n, -1) < 0 && errno != EINTR)
		return;
}

/* Moves the daemon's victims into scratch, then unshares the runs flagged DROP_RUN_UNSHARE;
 * reports per-page status in the message's order, and the scratch page the DROP's pages start
 * at. The moved pages stay in the scratch until the daemon's FREE: it reads them back first,
 * since a page written through a pin (an I/O in flight) after the daemon read it can hold more
 * than the daemon stored. The unsharing comes after every move of the DROP: it may write-fault
 * a page the daemon protects, and the daemon lets such a fault of this thread through only
 * because nothing of this DROP moves any more.
 *
 * The scratch is used as a ring: each DROP's pages follow the last one's, and the daemon sends
 * a FREE (answered) before a DROP that would not fit. Never freed during a DROP: freeing
 * raises a REMOVE event, which waits until the daemon's handler reads it, and the daemon holds
 * its handler from reading while a DROP moves pages (reclaim/mod.rs, drop_by_agent). A DROP
 * that does not fit moves nothing: its pages are reported ENOSPC. */
static void do_drop(struct agent *ag, const uint8_t *p, uint32_t len, uint32_t seq)
{
	uint32_t nruns = get32(p);
	/* EAGAIN from UFFDIO_MOVE: an event of this address space (the program's mremap, munmap,
	 * madvise, fork) is pending, or a page is busy. The DROP's addresses were chosen before
	 * that event, and once the daemon's handler has read it the kernel lets moves through
	 * again, before the handler has applied it: a move then takes whatever is at the old
	 * address now (another mapping's page that mremap put there), and the daemon, which no
	 * longer counts that address as part of the DROP, would free it with the scratch. So the
	 * first EAGAIN ends the DROP: the pages not moved, and the unsharing, are reported EAGAIN
	 * and the daemon keeps them in place (tests/clients/remap_race.c lost 13-24 pages in 40
	 * rounds while this retried at once). */
	int stale = 0;
	if (len != 8 + 16 * (uint64_t)nruns)
		fatal("malformed DROP from the daemon", EPROTO);
	uint64_t need = 0; /* pages this DROP may move */
	for (uint32_t r = 0; r < nruns; r++) {
		uint32_t pages = get32(p + 16 + 16 * r);
		if (!(get32(p + 20 + 16 * r) & DROP_RUN_UNSHARE))
			need += pages;
	}
	if (need > SCRATCH_PAGES)
		fatal("DROP larger than the scratch area", EPROTO);
	/* A scratch page still in use would refuse a move with EEXIST. */
	int nospace = ag->scratch_used + need > SCRATCH_PAGES;
	uint64_t base = nospace ? 0 : ag->scratch_used; /* this DROP's first scratch page */
	uint8_t *status = ag->out + HEADER_LEN + 8;
	uint64_t si = 0; /* pages so far, in the message's order: the index of the next status */
	uint64_t k = 0;  /* pages moved so far: the next scratch slot after base */
	for (uint32_t r = 0; r < nruns; r++) {
		uint64_t addr = get64(p + 8 + 16 * r);
		uint32_t pages = get32(p + 16 + 16 * r);
		uint32_t flags = get32(p + 20 + 16 * r);
		if (pages == 0 || si + pages > MAX_DROP_PAGES || (flags & ~(uint32_t)DROP_RUN_UNSHARE))
			fatal("malformed DROP from the daemon", EPROTO);
		if (flags & DROP_RUN_UNSHARE) {
			si += pages; /* below, once nothing moves any more */
			continue;
		}
		if (base + k + pages > SCRATCH_PAGES)
			fatal("DROP larger than the scratch area", EPROTO);
		if (nospace) {
			memset(status + si, ENOSPC, pages);
			si += pages;
			continue;
		}
		uint64_t done = 0;
		while (done < pages && !stale) {
			struct uffdio_move_ mv = {
				.dst = (uint64_t)ag->scratch + (base + k + done) * PAGE,
				.src = addr + done * PAGE,
				.len = (pages - done) * PAGE,
				.mode = UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
			};
			int rc = (int)syscall(SYS_ioctl, ag->uffd, UFFDIO_MOVE_, &mv);
			int e = rc == 0 ? 0 : (errno ? errno : EIO);
			uint64_t moved = mv.move > 0 ? (uint64_t)mv.move / PAGE : 0;
			if (rc == 0)
				moved = pages - done;
			for (uint64_t i = 0; i < moved; i++)
				status[si + done + i] = 0;
			done += moved;
			if (e == EAGAIN)
				stale = 1; /* the rest of the DROP is reported EAGAIN below */
			else if (rc != 0 && done < pages) {
				/* This page failed (EBUSY: shared after fork or pinned): report, go on. */
				status[si + done] = (uint8_t)(e > 255 ? 255 : e);
				done++;
			}
		}
		/* Not moved: EAGAIN (kept in place by the daemon, chosen again later). */
		for (uint64_t i = done; i < pages; i++)
			status[si + i] = EAGAIN;
		k += pages;
		si += pages;
	}
	if (!nospace)
		ag->scratch_used = base + k;
	uint64_t at = 0;
	for (uint32_t r = 0; r < nruns; r++) {
		uint32_t pages = get32(p + 16 + 16 * r);
		if (get32(p + 20 + 16 * r) & DROP_RUN_UNSHARE) {
			if (stale)
				memset(status + at, EAGAIN, pages);
			else
				do_unshare(get64(p + 8 + 16 * r), pages, status + at);
		}
		at += pages;
	}
	send_done(ag, seq, (uint32_t)si, (uint32_t)base);
}

/* Blocks every signal but glibc's two internal ones (SIGCANCEL 32 and SIGSETXID 33: setuid()
 * in a threaded program waits until every thread has handled SIGSETXID), as pthread_sigmask
 * does, without its libc data accesses. */
static void block_signals(void)
{
	uint64_t all = ~((1ULL << (32 - 1)) | (1ULL << (33 - 1)));
	syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, NULL, sizeof all);
}

/* Whether the daemon has exited (also while it is a zombie nobody has reaped yet), looked up by
 * its pid: only where that number means the daemon (ag->daemon_pid_ok), else 0. */
static int daemon_exited(struct agent *ag)
{
	if (!ag->daemon_pid_ok)
		return 0;
	long pfd = syscall(SYS_pidfd_open, ag->daemon_pid, 0);
	if (pfd < 0)
		return errno == ESRCH;
	struct pollfd p = { .fd = (int)pfd, .events = POLLIN };
	long r = syscall(SYS_poll, &p, 1, 0);
	syscall(SYS_close, pfd);
	return r > 0 && (p.revents & POLLIN);
}

/* What a poll of the lifeline says: the daemon ended (its write end closed: POLLHUP, or
 * POLLERR), the descriptor is not open (POLLNVAL), or neither. Data (POLLIN alone) means
 * nothing: the daemon never writes. */
enum lifeline_state { LIFELINE_UP, LIFELINE_DOWN, LIFELINE_CLOSED };

static enum lifeline_state lifeline_revents(short revents)
{
	if (revents & POLLNVAL)
		return LIFELINE_CLOSED;
	if (revents & (POLLHUP | POLLERR))
		return LIFELINE_DOWN;
	return LIFELINE_UP;
}

/* Whether the daemon has exited, by its lifeline `fd` in the calling thread's table if there
 * is one (-1 if not; waiting up to `wait_ms` for it to hang up), else by its number where that
 * means it. */
static int daemon_gone(struct agent *ag, int fd, int wait_ms)
{
	if (fd >= 0) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		long r;
		do {
			r = syscall(SYS_poll, &p, 1, wait_ms);
		} while (r < 0 && errno == EINTR);
		enum lifeline_state st = r > 0 ? lifeline_revents(p.revents) : LIFELINE_UP;
		if (st != LIFELINE_CLOSED)
			return st == LIFELINE_DOWN;
	}
	return daemon_exited(ag);
}

/* Whether this process is in the daemon's pid namespace (its /proc/self/ns/pid names the one
 * the daemon said it is in): then the daemon's pid means the daemon here. */
static int in_daemon_pid_namespace(struct agent *ag)
{
	char ns[sizeof ag->daemon_pidns];
	int saved = errno;
	long n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/ns/pid", ns, sizeof ns - 1);
	errno = saved;
	if (n <= 0 || !ag->daemon_pidns[0])
		return 0;
	ns[n] = 0;
	return strcmp(ns, ag->daemon_pidns) == 0;
}

/* A pidfd of thread `tid` of this process (PIDFD_THREAD, Linux 6.9), or -1: -1 also when no
 * thread of this process has that id (a raw clone child, whose copy of the agent's state names
 * its parent's threads), so that a stale id never reaches into another process. errno is kept. */
static int own_thread_pidfd(int tid)
{
	int saved = errno;
	long me = syscall(SYS_getpid);
	int pfd = -1;
	if (tid > 0 && syscall(SYS_tgkill, me, tid, 0) == 0) {
		pfd = (int)syscall(SYS_pidfd_open, tid, PIDFD_THREAD_);
		/* (Still ours once the pidfd holds it: a tid freed and reused in between is not.) */
		if (pfd >= 0 && syscall(SYS_tgkill, me, tid, 0) != 0) {
			syscall(SYS_close, pfd);
			pfd = -1;
		}
	}
	errno = saved;
	return pfd;
}

/* Closes every descriptor of the calling thread's (own) table but `keep_a`, `keep_b` and
 * `keep_c` (any may be -1). */
static void close_all_but(int keep_a, int keep_b, int keep_c)
{
	int keep[3] = { keep_a, keep_b, keep_c };
	for (int i = 0; i < 3; i++) /* sorted */
		for (int j = i + 1; j < 3; j++)
			if (keep[j] < keep[i]) {
				int t = keep[i];
				keep[i] = keep[j];
				keep[j] = t;
			}
	unsigned int from = 0;
	for (int i = 0; i < 3; i++) {
		if (keep[i] < 0 || (unsigned int)keep[i] < from)
			continue; /* none, or the same as the one before */
		if ((unsigned int)keep[i] > from)
			syscall(SYS_close_range, from, (unsigned int)keep[i] - 1, 0);
		from = (unsigned int)keep[i] + 1;
	}
	syscall(SYS_close_range, from, ~0U, 0);
}

static void futex_wake(volatile int *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/*
 * Gives the calling agent thread a descriptor table of its own (unshare(CLONE_FILES)), holding
 * only `keep_a`, `keep_b` and `keep_c`. The program's table then holds nothing of the agent's: a program
 * that closes its descriptors (closefrom, close_range, daemons and shells before exec) cannot
 * cut the agent off, a fork child inherits none of them, a program started with 0-2 closed
 * gets its own files there, and a program counting its descriptors sees only its own. Nothing
 * the program opens later reaches this table either.
 */
static int own_fd_table(int keep_a, int keep_b, int keep_c)
{
	if (syscall(SYS_unshare, CLONE_FILES) != 0)
		return -1;
	close_all_but(keep_a, keep_b, keep_c);
	return 0;
}

/* A copy of the program's standard error, for a message from an agent thread (whose own table
 * holds none: it would keep the program's stderr open after the program closed it). -1 if the
 * program has none or the thread-group leader has exited. */
static int program_stderr(void)
{
	int pfd = (int)syscall(SYS_pidfd_open, syscall(SYS_getpid), 0);
	if (pfd < 0)
		return -1;
	int fd = (int)syscall(SYS_pidfd_getfd, pfd, 2, 0);
	syscall(SYS_close, pfd);
	return fd;
}

static void say_from_agent(const char *msg)
{
	int fd = program_stderr();
	if (fd < 0)
		return;
	syscall(SYS_write, fd, msg, strlen(msg));
	syscall(SYS_close, fd);
}

/* The agent thread of a fork child greets the daemon itself: the child's program goes on at
 * once, and nothing of the greeting happens in a program thread (whose privileges or seccomp
 * filter may forbid it). On failure the process runs on: the daemon serves its faults through
 * the uffd the kernel gave it at the fork, but cannot evict its pages. After a step-out the
 * thread greets on the connection the program thread made before the call (`ag->sock`, kept in
 * this thread's table), so that a call that changed the mount namespace cannot keep it from
 * the daemon's socket. Either way the daemon answers with this process's uffd and its lifeline. */
static int greet_again(struct agent *ag)
{
	if (ag->sock < 0)
		ag->sock = connect_daemon();
	if (ag->sock < 0)
		return -1;
	int fd = -1, line = -1;
	if (hello(ag, ag->greet_flags, -1, &fd, &line) < 0 || fd < 0) {
		int e = errno;
		if (line >= 0)
			syscall(SYS_close, line);
		syscall(SYS_close, ag->sock);
		errno = e;
		return -1;
	}
	ag->uffd = fd;
	/* For the watchdog to take (it polls every 100 ms). */
	__atomic_store_n(&ag->lifeline, line, __ATOMIC_RELEASE);
	return 0;
}

/*
 * Per-thread credentials. The kernel keeps credentials per thread. glibc makes setuid() and its
 * kin, and setgroups(), in every thread of the process (SIGSETXID), and aborts the process when
 * the threads' results differ; the agent's two threads are glibc threads and take part. Other
 * changes a thread makes to its own credentials glibc does not broadcast: capset(2), and prctl's
 * PR_SET_KEEPCAPS, PR_SET_SECUREBITS, PR_CAPBSET_DROP, PR_CAP_AMBIENT and PR_SET_NO_NEW_PRIVS
 * (each changes only `current`: kernel/capability.c, security/commoncap.c, kernel/sys.c). Left
 * behind by one of them, the agent's threads made a later broadcast differently: setpriv
 * --reuid --regid keeps its capabilities over the uid change (KEEPCAPS), raises its effective set
 * again (capset), and its setresgid then failed with EPERM in the agent's threads only: SIGABRT.
 *
 * So the wrappers (capset, syscall, prctl) make such a change in the program thread and, if it
 * succeeded, hand the same call to the agent's threads, wake them (an eventfd in each one's own
 * descriptor table, borrowed through a thread pidfd) and wait, bounded, until both have made it.
 * A thread can only change its own credentials, so each makes the call itself, with raw system
 * calls and this state only. The agent's threads start with the credentials of the thread that
 * starts them (the constructor's, or a fork child's) and then make every such change after the
 * program: a call's outcome depends only on the calling thread's credentials, so it succeeds
 * there as it did in the program thread and leaves the same state. With several program threads
 * changing their own credentials differently, the agent's threads follow the latest change.
 * Not followed: a program under a seccomp filter (the agent makes no call in its threads then),
 * a vfork child (it shares this state, not these threads), a change made by a raw system call
 * instruction, and per-thread state no set*id result depends on (setfsuid's fsuid, which file
 * servers switch per request; Landlock domains; keyrings).
 */

/* In an agent thread (`who`): makes the program's latest credential change here too, if this
 * thread has not yet; `woken`: its eventfd is readable (emptied here). Raw system calls, this
 * thread's stack and the agent state only; it never waits for a program thread (one writing a
 * change may be held in a fault that waits for a DROP of this very thread): a change still
 * being written is made when its writer wakes this thread again, once it is written. */
static void follow_creds(struct agent *ag, int who, int woken)
{
	struct cred_follow *cf = &ag->cred;
	uint64_t drained;
	if (woken)
		(void)syscall(SYS_read, cf->wake_fd[who], &drained, sizeof drained);
	for (;;) {
		uint32_t s = __atomic_load_n(&cf->seq, __ATOMIC_ACQUIRE);
		if (s == cf->done[who] || (s & 1))
			return;
		struct cred_change c;
		memcpy(&c, &cf->change, sizeof c);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&cf->seq, __ATOMIC_RELAXED) != s)
			continue; /* rewritten meanwhile (only after a wait that ran out) */
		long r;
		if (c.nr == SYS_capset) {
			struct cap_header_ h = { c.version, 0 };
			r = syscall(SYS_capset, &h, c.data);
		} else {
			r = syscall(c.nr, c.arg[0], c.arg[1], c.arg[2], c.arg[3], c.arg[4]);
		}
		cf->err[who] = r < 0 ? errno : 0;
		__atomic_store_n(&cf->done[who], s, __ATOMIC_RELEASE);
		__atomic_add_fetch(&cf->acks, 1, __ATOMIC_RELEASE);
		syscall(SYS_futex, &cf->acks, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
	}
}

/* In an agent thread, in its own descriptor table: the eventfd that wakes it for a change. */
static void cred_wake_fd(struct agent *ag, int who)
{
	ag->cred.wake_fd[who] = (int)syscall(SYS_eventfd2, 0, O_CLOEXEC | O_NONBLOCK);
}

/* The agent thread between DROPs: waits until the daemon's socket has something to read,
 * making the program's credential changes meanwhile. 1 when the socket is readable (or poll
 * failed: the read then blocks, as it did before there were changes to follow). */
static int wait_for_packet(struct agent *ag)
{
	struct pollfd p[2] = { { .fd = ag->sock, .events = POLLIN },
			       { .fd = ag->cred.wake_fd[CRED_AGENT], .events = POLLIN } };
	long r = syscall(SYS_poll, p, 2, ag->cred.wait_ms);
	int e = errno;
	follow_creds(ag, CRED_AGENT, r > 0 && (p[1].revents & POLLIN));
	if (r < 0)
		return e != EINTR;
	return p[0].revents != 0;
}

static void *agent_loop(struct agent *ag);

static void *agent_thread(void *arg)
{
	struct agent *ag = arg;
	ag->agent_running = 1;
	agent_loop(ag);
	ag->agent_running = 0;
	return NULL;
}

static void *agent_loop(struct agent *ag)
{
	block_signals();
	syscall(SYS_prctl, PR_SET_NAME, "uffd-agent", 0, 0, 0);
	/* The constructor's socket, uffd and copy of the daemon's lifeline, or the socket made for
	 * a restart (fork children have none of them: -1; they get the uffd and the lifeline with
	 * the answer to their greeting). */
	int ok = own_fd_table(ag->sock, ag->fork_child ? -1 : ag->uffd, ag->fork_child ? -1 : ag->boot_lifeline) == 0;
	ag->tid = (int)syscall(SYS_gettid);
	if (ok && !ag->fork_child)
		__atomic_store_n(&ag->lifeline, ag->boot_lifeline, __ATOMIC_RELEASE);
	if (ok) {
		cred_wake_fd(ag, CRED_AGENT);
		/* Woken through a thread pidfd (Linux 6.9); without them, a look every 100 ms. */
		long self = syscall(SYS_pidfd_open, ag->tid, PIDFD_THREAD_);
		if (self >= 0)
			syscall(SYS_close, self);
		ag->cred.wait_ms = ag->cred.wake_fd[CRED_AGENT] >= 0 && self >= 0 ? -1 : 100;
	}
	ag->ready = ok ? 1 : -1;
	futex_wake(&ag->ready);
	if (!ok)
		return NULL;
	/* Name this thread to the daemon: a read of the (empty) first scratch page raises a missing
	 * fault there that carries our thread id; the daemon maps the zero page, which we drop again.
	 * The whole scratch is emptied first: a fork child inherits whatever its parent's agent had
	 * moved there and not yet freed. */
	syscall(SYS_madvise, ag->scratch, SCRATCH_PAGES * PAGE, MADV_DONTNEED);
	(void)*(volatile char *)ag->scratch;
	syscall(SYS_madvise, ag->scratch, PAGE, MADV_DONTNEED);
	int greet = ag->fork_child ? greet_again(ag) : 0;
	if (ag->fork_child) {
		ag->greeted = greet < 0 ? -1 : 1;
		futex_wake(&ag->greeted);
	}
	if (greet < 0 && ag->greet_flags == HELLO_AGENT_RESTART)
		return NULL; /* the program thread that started us says it (agent_step_in) */
	if (greet < 0) {
		char line[200];
		snprintf(line, sizeof line,
			 "uffd-agent[%ld]: a forked child cannot greet uffd-daemon (%s); its pages are served "
			 "but not evicted\n",
			 syscall(SYS_getpid), strerror(errno));
		say_from_agent(line);
		return NULL;
	}
	for (;;) {
		if (!wait_for_packet(ag))
			continue;
		ssize_t n = recv_packet(ag->sock, ag->buf, sizeof ag->buf, NULL);
		if (n <= 0) {
			if (n < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			break;
		}
		uint32_t len;
		uint16_t kind = 0;
		if (n >= HEADER_LEN)
			memcpy(&kind, ag->buf + 6, 2);
		const uint8_t *p = check_packet(ag->buf, n, kind == KIND_FREE ? KIND_FREE : KIND_DROP, &len);
		if (p && kind == KIND_FREE && len == 0) {
			free_scratch(ag);
			send_done(ag, get32(ag->buf + 12), 0, 0);
			continue;
		}
		if (!p || kind != KIND_DROP || len < 8)
			fatal("malformed message from the daemon", EPROTO);
		do_drop(ag, p, len, get32(ag->buf + 12));
	}
	/* The connection is gone, and with no DROP in progress. If the daemon is gone too, evicted
	 * pages can never come back: stop now rather than run on with pages that would read as
	 * zeros or never arrive. (A dying daemon closes its descriptors one by one: its lifeline
	 * is given a second to hang up, since this thread's end closes the uffd, after which a
	 * fault on an evicted page reads zeros instead of waiting for the watchdog.) */
	syscall(SYS_close, ag->sock);
	int line = __atomic_exchange_n(&ag->lifeline, -1, __ATOMIC_ACQ_REL);
	if (ag->leaving || ag->closing) {
		if (line >= 0)
			syscall(SYS_close, line);
		return NULL; /* the daemon closed it on our LEAVE (it brings every page back) or on a
			      * STEP_OUT (a new agent thread greets again after the call) */
	}
	if (daemon_gone(ag, line, 1000))
		die_daemon_lost();
	if (line >= 0)
		syscall(SYS_close, line);
	say_from_agent("uffd-agent: lost the connection to uffd-daemon; pages are still served but no "
		       "longer evicted\n");
	return NULL;
}

/* Whether every thread of the process but the agent's two has exited (the leader, once it
 * has, stays as a zombie and is still counted). glibc ends the process when its last thread
 * exits, and counts the agent's threads: without this, they would keep a process alive whose
 * program called pthread_exit in its last thread. `stat_fd` is /proc/self/stat. */
static long stat_threads(int stat_fd, char *state)
{
	char buf[1024];
	ssize_t n = syscall(SYS_pread64, stat_fd, buf, sizeof buf - 1, 0);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	/* Fields after the command name (which may hold spaces and parentheses): state is the
	 * first, num_threads the 18th. */
	char *p = strrchr(buf, ')');
	if (!p)
		return -1;
	p += 2;
	*state = *p;
	long threads = 0;
	for (int field = 0; *p && field < 17; p++)
		if (*p == ' ')
			field++;
	while (*p >= '0' && *p <= '9')
		threads = threads * 10 + (*p++ - '0');
	return threads;
}

static int only_agent_threads_left(int stat_fd, int ours)
{
	char state = 0;
	long threads = stat_threads(stat_fd, &state);
	return threads >= 0 && threads == ours + (state == 'Z');
}

/* The identity of a lifeline `fd`, the same in every copy of it (the pipe's device and inode),
 * into `id`: 0, or -1 if `fd` is not a pipe. errno is kept. */
static int lifeline_id(int fd, uint64_t id[2])
{
	struct stat st;
	int saved = errno;
	long r = syscall(SYS_newfstatat, fd, "", &st, AT_EMPTY_PATH);
	errno = saved;
	if (r != 0 || !S_ISFIFO(st.st_mode))
		return -1;
	id[0] = (uint64_t)st.st_dev;
	id[1] = (uint64_t)st.st_ino;
	return 0;
}

/* Whether `fd` is still the lifeline whose identity is `id`. */
static int is_lifeline(int fd, const uint64_t id[2])
{
	uint64_t now[2];
	return fd >= 0 && lifeline_id(fd, now) == 0 && now[0] == id[0] && now[1] == id[1];
}

/* In the watchdog: a copy of the daemon's lifeline for its own table, taken from the agent
 * thread's once that has one (the answer to its greeting), or -1. */
static int take_lifeline(struct agent *ag)
{
	int src = __atomic_load_n(&ag->lifeline, __ATOMIC_ACQUIRE);
	if (src < 0)
		return -1;
	int t = own_thread_pidfd(ag->tid);
	if (t < 0)
		return -1;
	int saved = errno;
	int fd = (int)syscall(SYS_pidfd_getfd, t, src, 0);
	syscall(SYS_close, t);
	/* The agent thread may have let it go meanwhile (its connection ended), and the number may
	 * name another of its descriptors by now: kept only if the lifeline is still there. */
	if (fd >= 0 && __atomic_load_n(&ag->lifeline, __ATOMIC_ACQUIRE) != src) {
		syscall(SYS_close, fd);
		fd = -1;
	}
	errno = saved;
	return fd;
}

/*
 * The watchdog waits for the daemon to exit, and for the program's last thread to exit. It is
 * separate from the agent thread because that one can be blocked for good when the daemon
 * dies: its MADV_DONTNEED of the scratch area raises an event that only the daemon can read.
 * _exit() kills every thread of the process, including threads blocked in faults or events
 * (they sleep killable).
 */
static void *watchdog_thread(void *arg)
{
	struct agent *ag = arg;
	block_signals();
	syscall(SYS_prctl, PR_SET_NAME, "uffd-watchdog", 0, 0, 0);
	ag->watchdog_tid = (int)syscall(SYS_gettid);
	/* The daemon's lifeline: the constructor's copy, kept in this thread's table; in a fork
	 * child or after a step-out, the one the agent thread receives with the answer to its
	 * greeting, taken below once it has it. Until then the daemon's number serves, where it
	 * means the daemon (this process is in the daemon's pid namespace: daemon_exited). */
	int line = ag->boot_lifeline;
	/* Best effort: without a table of its own it still guards the process, with its
	 * descriptors in the program's table (and the liveness check below if they are closed). */
	int own = own_fd_table(line, -1, -1) == 0;
	/* Without one, the constructor's copy is in the program's table, where the constructor
	 * closes it: a copy of this thread's (which the program may close too, and its number be
	 * reused: so whatever the poll says of it is believed only while it is still the lifeline). */
	if (!own && line >= 0)
		line = (int)syscall(SYS_fcntl, line, F_DUPFD_CLOEXEC, 0);
	uint64_t id[2] = { 0, 0 };
	if (line >= 0 && lifeline_id(line, id) < 0) {
		syscall(SYS_close, line);
		line = -1;
	}
	/* Without a table of its own, no eventfd (the program would see it): the poll below looks
	 * for credential changes every 100 ms. */
	if (own)
		cred_wake_fd(ag, CRED_WATCHDOG);
	ag->cred.up = 1;
	futex_wake(&ag->cred.up);
	long stat_fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/stat", O_RDONLY | O_CLOEXEC);
	for (;;) {
		if (line < 0) {
			line = take_lifeline(ag);
			if (line >= 0 && lifeline_id(line, id) < 0) {
				syscall(SYS_close, line);
				line = -1;
			}
		}
		/* (poll skips an entry whose fd is -1.) */
		struct pollfd p[2] = { { .fd = line, .events = POLLIN },
				       { .fd = ag->cred.wake_fd[CRED_WATCHDOG], .events = POLLIN } };
		long r = syscall(SYS_poll, p, 2, 100);
		follow_creds(ag, CRED_WATCHDOG, r > 0 && (p[1].revents & POLLIN));
		enum lifeline_state st = r > 0 && line >= 0 ? lifeline_revents(p[0].revents) : LIFELINE_UP;
		if (st != LIFELINE_UP && !is_lifeline(line, id))
			st = LIFELINE_CLOSED; /* (not ours to close: the program's now) */
		if (st == LIFELINE_DOWN)
			die_daemon_lost();
		if (st == LIFELINE_CLOSED)
			line = -1;
		if (line < 0 && daemon_exited(ag))
			die_daemon_lost();
		if (ag->stepping_out) {
			/* A call that needs the process alone: a new watchdog starts after it. */
			syscall(SYS_close, stat_fd);
			if (is_lifeline(line, id))
				syscall(SYS_close, line);
			syscall(SYS_close, ag->cred.wake_fd[CRED_WATCHDOG]);
			return NULL;
		}
		if (stat_fd >= 0 && only_agent_threads_left((int)stat_fd, 1 + ag->agent_running))
			exit(0); /* what glibc does when the last of its threads exits */
		if (ag->leaving) {
			/* Every evicted page is coming back: the daemon's end no longer matters. */
			syscall(SYS_close, stat_fd);
			if (is_lifeline(line, id))
				syscall(SYS_close, line);
			syscall(SYS_close, ag->cred.wake_fd[CRED_WATCHDOG]);
			return NULL;
		}
	}
	return NULL;
}

/* Before the agent's threads start (in the constructor, or in a fork child whose copy of this
 * state may hold its parent's lock or a change half written by another of its parent's
 * threads): they start with the starting thread's credentials, and have nothing to make yet. */
static void cred_follow_start(struct agent *ag)
{
	struct cred_follow *cf = &ag->cred;
	cf->owner = 0;
	cf->seq = (cf->seq + 1) & ~1u;
	cf->done[CRED_AGENT] = cf->done[CRED_WATCHDOG] = cf->seq;
	cf->wake_fd[CRED_AGENT] = cf->wake_fd[CRED_WATCHDOG] = -1;
	cf->wait_ms = 100;
	cf->up = 0;
	cf->pid = (pid_t)syscall(SYS_getpid);
	cf->said = 0;
	ag->watchdog_tid = 0;
}

/* Starts the agent's two threads and waits until the agent thread has its own descriptor
 * table; returns 0, or -1 if it could not get one. */
static int start_threads(struct agent *ag)
{
	pthread_attr_t at;
	pthread_t th;
	ag->ready = 0;
	ag->tid = 0;
	ag->daemon_pid_ok = in_daemon_pid_namespace(ag);
	cred_follow_start(ag);
	/* The watchdog first: without it no agent thread may run (the daemon's death would go
	 * unseen), and a failure here leaves nothing to undo. */
	pthread_attr_init(&at);
	pthread_attr_setstack(&at, ag->watchdog_stack, WATCHDOG_STACK_BYTES);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&th, &at, watchdog_thread, ag);
	pthread_attr_destroy(&at);
	if (rc != 0) {
		errno = rc;
		return -1;
	}
	pthread_attr_init(&at);
	pthread_attr_setstack(&at, ag->stack, STACK_BYTES);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&th, &at, agent_thread, ag);
	pthread_attr_destroy(&at);
	if (rc != 0) {
		errno = rc;
		/* The watchdog alone: it guards the daemon's end as before, and waits for nothing. */
		while (ag->cred.up == 0)
			syscall(SYS_futex, &ag->cred.up, FUTEX_WAIT, 0, NULL, NULL, 0);
		return -1;
	}
	while (ag->ready == 0)
		syscall(SYS_futex, &ag->ready, FUTEX_WAIT, 0, NULL, NULL, 0);
	/* The watchdog too, before the program runs on: it takes part in the program's set*id
	 * from its first instruction, and must be known to follow the credential changes before. */
	while (ag->cred.up == 0)
		syscall(SYS_futex, &ag->cred.up, FUTEX_WAIT, 0, NULL, NULL, 0);
	return ag->ready > 0 ? 0 : -1;
}

static void atfork_child(void)
{
	struct agent *ag = g_agent;
	if (!ag)
		return;
	/* Another thread of the parent may have held it at the fork: it is not in the child. */
	g_sig_lock = 0;
	/* Show the daemon which process this is: the fault arrives on our new uffd (wipe-on-fork:
	 * the page is empty here) and waits while the daemon writes its token into the page and
	 * finds the process that holds it (bind.rs). */
	volatile char c = *(volatile char *)ag->probe;
	(void)c;
	/* Under the program's seccomp filter, which this thread and any thread it starts obey, any
	 * call of ours may be one the filter kills the process for (glibc aborts a new thread whose
	 * rseq registration is refused): the child runs without an agent, its faults served, its
	 * pages not evicted, and the daemon's census says so. */
	if (ag->filtered)
		return;
	/* The parent's descriptors were in its agent thread's table, not copied here. The new agent
	 * thread greets the daemon and receives this process's uffd and the daemon's lifeline. */
	ag->sock = -1;
	ag->uffd = -1;
	ag->boot_lifeline = -1;
	ag->lifeline = -1;
	ag->fork_child = 1;
	ag->greet_flags = HELLO_FORK_CHILD;
	ag->greeted = 0;
	ag->closing = 0;
	ag->stepping_out = 0;
	if (start_threads(ag) < 0) {
		say("uffd-agent: a forked child cannot start its agent; its pages are served but not "
		    "evicted\n");
	} else {
		/* The child starts managed, as its parent did: fork returns once its agent is greeted
		 * (a futex wait here, nothing a seccomp filter or a privilege drop is likely to
		 * forbid). */
		while (ag->greeted == 0)
			syscall(SYS_futex, &ag->greeted, FUTEX_WAIT, 0, NULL, NULL, 0);
	}
	/* Emptied only now: what the daemon wrote there shows which process this is until the
	 * greeting (bind.rs, bind_at_greeting). */
	syscall(SYS_madvise, ag->probe, PAGE, MADV_DONTNEED);
}

/*
 * mmap: programs that map memory themselves (stress-ng's buffers, language runtimes) get the
 * range registered before mmap returns, so no page of it is populated behind the daemon's
 * back. glibc's malloc maps memory internally, not through this symbol: the daemon finds those
 * ranges in /proc/PID/maps. Registering here is an optimisation, never a requirement: the
 * daemon's own scan registers whatever this misses (registering twice with the same uffd is a
 * no-op).
 */
static int register_new_mapping(void *addr, size_t len, int prot, int flags)
{
	struct agent *ag = g_agent;
	if (!ag || addr == MAP_FAILED || len < 16 * PAGE || ag->tid <= 0 || !ag->agent_running || ag->filtered)
		return -1;
	/* Private or shared (MAP_SHARED|MAP_ANONYMOUS: the daemon pages it by identity) anonymous. */
	if (!(flags & MAP_ANONYMOUS) || !(flags & (MAP_PRIVATE | MAP_SHARED)) || (flags & MAP_HUGETLB) ||
	    (prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE))
		return -1;
	int saved = errno;
	/* The uffd lives in the agent thread's own table: borrow it for the call (Linux 6.9's
	 * thread pidfds; without them the daemon's scan registers the range a little later). */
	int rc = -1;
	int pfd = own_thread_pidfd(ag->tid);
	if (pfd >= 0) {
		int uffd = (int)syscall(SYS_pidfd_getfd, pfd, ag->uffd, 0);
		syscall(SYS_close, pfd);
		if (uffd >= 0) {
			struct uffdio_register_ reg = { .range = { (uint64_t)addr, (len + PAGE - 1) & ~(PAGE - 1) },
							.mode = 1 | 2 };
			rc = (int)syscall(SYS_ioctl, uffd, UFFDIO_REGISTER_, &reg);
			syscall(SYS_close, uffd);
		}
	}
	errno = saved;
	return rc;
}

__attribute__((visibility("default"))) void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	/* MAP_POPULATE would fill the whole range before we could register it, past the limit and
	 * behind the daemon's back: map without it, register, then populate through the faults
	 * (MADV_POPULATE_WRITE), which the daemon serves and throttles like any other. */
	/* Locked mappings (MAP_LOCKED, or any after mlockall(MCL_FUTURE)) are the program's to keep
	 * in RAM: not registered here (the census leaves them alone). */
	int managed = g_agent && !g_agent->filtered && (flags & MAP_ANONYMOUS) && (flags & (MAP_PRIVATE | MAP_SHARED)) &&
		      !(flags & (MAP_HUGETLB | MAP_LOCKED)) && !g_agent->lock_future &&
		      (prot & (PROT_READ | PROT_WRITE)) == (PROT_READ | PROT_WRITE);
	int populate = managed && (flags & MAP_POPULATE);
	long r = syscall(SYS_mmap, addr, len, prot, populate ? flags & ~MAP_POPULATE : flags, fd, off);
	void *p = r == -1 ? MAP_FAILED : (void *)r;
	int registered = register_new_mapping(p, len, prot, flags) == 0;
	if (populate && p != MAP_FAILED) {
		int saved = errno;
		/* Not registered (no thread pidfds): populate now, the daemon's scan finds the pages. */
		(void)syscall(SYS_madvise, p, len, 23 /* MADV_POPULATE_WRITE */);
		(void)registered;
		errno = saved;
	}
	return p;
}

__attribute__((visibility("default"))) void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}

/*
 * glibc's malloc maps its large chunks and grows its main heap (brk) with internal calls that
 * no symbol interposes, and a program usually fills such memory the moment it gets it (a hash
 * table, a buffer): before the daemon's scanner (RssAnon polled every 2 ms) has registered it,
 * past the limit and behind the daemon's back. So the allocation functions are wrapped: each
 * calls whichever allocator the program resolves next (dlsym(RTLD_NEXT): glibc's, or a
 * jemalloc or tcmalloc library loaded after the agent), and when that is glibc's own, the
 * memory it has just mapped is registered before the caller can touch it:
 *   - a chunk glibc mapped for itself (IS_MMAPPED in its header: the mapping starts
 *     `prev_size` bytes before the chunk and is `prev_size + size` long);
 *   - the main heap's growth since the last call (glibc's cached break, `__curbrk`).
 * Another allocator maps through mmap(), which the wrapper above registers; a program that
 * defines malloc itself never calls these. What is still missed (thread arenas grown by
 * mprotect) the scan registers as before. Registering is an optimisation here too.
 *
 * dlsym may allocate while it resolves (the first call can come from the dynamic linker, before
 * the constructor): such calls get memory from a small static pool that free() ignores.
 */
extern void *__libc_malloc(size_t);
/* glibc's cached program break, which sbrk(0) returns (exported since glibc 2.2.5): read
 * directly, it costs a load per call instead of a call (3-4 ns, twice per malloc and free). */
extern void *__curbrk;

static struct {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void (*free)(void *);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	int glibc;          /* the program's allocator is glibc's (chunk headers are glibc's) */
	volatile int state; /* 0 unresolved, 1 resolving, 2 resolved */
	volatile int resolver; /* the thread resolving */
} g_alloc;

static _Alignas(16) char g_boot_pool[64 * 1024];
static size_t g_boot_used;
/* The main heap's break when last looked at (0: not yet known; the daemon's scan covers the
 * heap as it was at the greeting). */
static volatile uintptr_t g_brk_seen;

static int boot_owned(const void *p)
{
	return (const char *)p >= g_boot_pool && (const char *)p < g_boot_pool + sizeof g_boot_pool;
}

/* Memory for calls made while the allocator is being resolved: 16-byte aligned, its size in
 * the 16 bytes before it (for realloc), never freed. */
static void *boot_alloc(size_t n, size_t align)
{
	if (align < 16)
		align = 16;
	if (n > sizeof g_boot_pool || (align & (align - 1)))
		return NULL;
	for (;;) {
		size_t used = __atomic_load_n(&g_boot_used, __ATOMIC_RELAXED);
		size_t start = (used + 16 + align - 1) & ~(align - 1);
		size_t end = start + ((n + 15) & ~15UL);
		if (end > sizeof g_boot_pool)
			return NULL;
		if (__atomic_compare_exchange_n(&g_boot_used, &used, end, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
			((size_t *)(g_boot_pool + start))[-1] = n;
			return g_boot_pool + start;
		}
	}
}

static int resolve_allocator(void)
{
	if (__atomic_load_n(&g_alloc.state, __ATOMIC_ACQUIRE) == 2)
		return 1;
	int expect = 0;
	if (!__atomic_compare_exchange_n(&g_alloc.state, &expect, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return __atomic_load_n(&g_alloc.state, __ATOMIC_ACQUIRE) == 2; /* recursion, or another thread */
	g_alloc.resolver = (int)syscall(SYS_gettid);
	g_alloc.malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	g_alloc.calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
	g_alloc.realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	g_alloc.free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
	g_alloc.posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
	g_alloc.aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
	g_alloc.memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
	if (!g_alloc.malloc || !g_alloc.calloc || !g_alloc.realloc || !g_alloc.free || !g_alloc.posix_memalign ||
	    !g_alloc.aligned_alloc || !g_alloc.memalign) {
		say("uffd-agent: cannot find the program's allocator (dlsym); stopping this process\n");
		_exit(EXIT_DAEMON_LOST);
	}
	g_alloc.glibc = g_alloc.malloc == __libc_malloc;
	__atomic_store_n(&g_alloc.state, 2, __ATOMIC_RELEASE);
	return 1;
}

/* Waits out another thread's resolution; 0 when this thread is the one resolving (a call from
 * inside dlsym), which must be served from the pool. */
static int allocator_ready(void)
{
	if (resolve_allocator())
		return 1;
	/* The resolving thread holds state 1 for a few dlsym calls: a call of its own from inside
	 * dlsym cannot wait for itself; any other thread waits. */
	int me = (int)syscall(SYS_gettid);
	while (__atomic_load_n(&g_alloc.state, __ATOMIC_ACQUIRE) != 2) {
		if (g_alloc.resolver == me)
			return 0;
		syscall(SYS_sched_yield);
	}
	return 1;
}

static void register_range(uintptr_t start, uintptr_t end)
{
	start = (start + PAGE - 1) & ~(PAGE - 1);
	end = (end + PAGE - 1) & ~(PAGE - 1);
	if (end > start)
		(void)register_new_mapping((void *)start, end - start, PROT_READ | PROT_WRITE,
					   MAP_PRIVATE | MAP_ANONYMOUS);
}

/* After glibc's allocator returned `p`: register what it mapped for it. */
static void note_allocation(void *p)
{
	struct agent *ag = g_agent;
	if (!g_alloc.glibc || !ag || ag->filtered || ag->lock_future || ag->tid <= 0)
		return;
	if (p) {
		const size_t *h = (const size_t *)p;
		size_t size = h[-1];
		if (size & 2 /* IS_MMAPPED */) {
			uintptr_t chunk = (uintptr_t)p - 2 * sizeof(size_t);
			uintptr_t map = chunk - h[-2];
			register_range(map, chunk + (size & ~(uintptr_t)7));
			return;
		}
	}
	uintptr_t cur = (uintptr_t)__curbrk;
	uintptr_t seen = g_brk_seen;
	if (cur == seen || cur == 0)
		return;
	g_brk_seen = cur;
	if (seen && cur > seen)
		register_range(seen, cur);
}

/* After a free: the heap may have shrunk (trimmed), and its growth back must be seen. */
static void note_free(void)
{
	if (!g_alloc.glibc || !g_agent)
		return;
	uintptr_t cur = (uintptr_t)__curbrk;
	if (cur != 0 && cur < g_brk_seen)
		g_brk_seen = cur;
}

__attribute__((visibility("default"))) void *malloc(size_t n)
{
	if (!allocator_ready())
		return boot_alloc(n, 16);
	void *p = g_alloc.malloc(n);
	note_allocation(p);
	return p;
}

__attribute__((visibility("default"))) void *calloc(size_t n, size_t m)
{
	if (!allocator_ready()) {
		if (m && n > (size_t)-1 / m)
			return NULL;
		return boot_alloc(n * m, 16); /* the static pool is zeroed and never reused */
	}
	void *p = g_alloc.calloc(n, m);
	note_allocation(p);
	return p;
}

__attribute__((visibility("default"))) void *realloc(void *old, size_t n)
{
	if (old && boot_owned(old)) {
		size_t had = ((size_t *)old)[-1];
		void *p = malloc(n);
		if (p)
			memcpy(p, old, had < n ? had : n);
		return p;
	}
	if (!allocator_ready())
		return old ? NULL : boot_alloc(n, 16);
	void *p = g_alloc.realloc(old, n);
	note_allocation(p);
	if (!p || p != old)
		note_free();
	return p;
}

__attribute__((visibility("default"))) void free(void *p)
{
	if (!p || boot_owned(p))
		return;
	if (!allocator_ready())
		return; /* cannot happen: only the pool hands out memory before resolution */
	g_alloc.free(p);
	note_free();
}

__attribute__((visibility("default"))) int posix_memalign(void **out, size_t align, size_t n)
{
	if (!allocator_ready()) {
		void *p = boot_alloc(n, align);
		if (!p)
			return ENOMEM;
		*out = p;
		return 0;
	}
	int rc = g_alloc.posix_memalign(out, align, n);
	if (rc == 0)
		note_allocation(*out);
	return rc;
}

__attribute__((visibility("default"))) void *aligned_alloc(size_t align, size_t n)
{
	if (!allocator_ready())
		return boot_alloc(n, align);
	void *p = g_alloc.aligned_alloc(align, n);
	note_allocation(p);
	return p;
}

__attribute__((visibility("default"))) void *memalign(size_t align, size_t n)
{
	if (!allocator_ready())
		return boot_alloc(n, align);
	void *p = g_alloc.memalign(align, n);
	note_allocation(p);
	return p;
}

/*
 * Core dumps. The kernel writes a core file with FOLL_DUMP, which takes a page that is not
 * mapped in anonymous memory for a hole: every evicted page would be zeros in the core. So the
 * agent handles the core-dumping signals the program leaves at their default action. When a
 * core would be written (dumpable, and RLIMIT_CORE and core_pattern allow one), the handler
 * asks the daemon to bring every evicted page back and to evict nothing more (HOLD,
 * HOLD_DUMP), and waits for the answer however long the pages take to come back; then it puts
 * the default action back and queues the same signal, with the same siginfo, for its own
 * thread. The signal is delivered as the handler returns: sigreturn has put the interrupted
 * registers back, so the kernel dumps the thread as it was at the crash (a fault's
 * instruction, abort's raise), with the signal's own siginfo, and the process dies of it with
 * the status it would have had.
 *
 * The program does not see it. sigaction() and the signal() family are interposed: the agent's
 * handler is kept only while the program's disposition is the default; the program reads back
 * the default action with the flags and mask it set last (the "shadow": what the kernel gave
 * back when the program set it, or at the agent's start); a program that installs a handler or
 * SIG_IGN replaces the agent's (it is the program's signal then), and one that sets the
 * default again gets the agent's back. glibc's own internal calls (abort, system, posix_spawn)
 * read and write the agent's handler as they would the default, and put it back as found. The
 * raw rt_sigaction system call through syscall() is interposed too; one made with a syscall
 * instruction of the program's own, or a look at SigCgt in /proc/PID/status, sees the
 * agent's handler. Never armed in a process with a seccomp filter (note_seccomp gives the
 * signals back first): the handler's calls could be ones the filter kills for.
 *
 * Not covered: a signal the kernel forces with its default action (a synchronous fault while
 * the signal is blocked, a seccomp kill, a signal frame that cannot be written: a stack
 * overflow in a thread with no alternate stack of the program's; the agent sets none, since the
 * program's own SA_ONSTACK handlers would run on it), a process with a seccomp filter, a vfork
 * or raw clone child before its exec (the daemon knows no address space by its pid). And the
 * program's other threads run on while the pages come back, where bare the kernel stops them
 * as soon as the dump begins.
 */
#define DUMP_SIGNALS ((1ULL << SIGQUIT) | (1ULL << SIGILL) | (1ULL << SIGTRAP) | (1ULL << SIGABRT) | \
		      (1ULL << SIGBUS) | (1ULL << SIGFPE) | (1ULL << SIGSEGV) | (1ULL << SIGXCPU) |    \
		      (1ULL << SIGXFSZ) | (1ULL << SIGSYS))

/* The kernel's struct sigaction (x86_64 and arm64 alike). */
struct ksigaction {
	void *handler;
	unsigned long flags;
	void *restorer;
	uint64_t mask;
};

static struct ksigaction g_shadow[64]; /* what the program set, for the signals the agent holds */
static volatile int g_dump_armed;      /* the agent handles core dumps in this process */
static volatile int g_dumping;         /* a core-dumping signal was handled: nothing is taken again */

static int ask_daemon_for(uint16_t kind, const uint8_t *payload, uint32_t len, int timeout_s);
static void dump_handler(int sig, siginfo_t *info, void *ucv);

static int dump_signal(int sig)
{
	return sig > 0 && sig < 64 && ((DUMP_SIGNALS >> sig) & 1);
}

static int k_sigaction(int sig, const struct ksigaction *act, struct ksigaction *old)
{
	return (int)syscall(SYS_rt_sigaction, sig, act, old, 8);
}

/* Every signal blocked (a handler of the program's cannot run into the lock it interrupted),
 * and the lock taken; `saved` gets the caller's mask back in sig_unlock. */
static void sig_lock(uint64_t *saved)
{
	uint64_t all = ~0ULL;
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, saved, 8);
	while (__atomic_exchange_n(&g_sig_lock, 1, __ATOMIC_ACQUIRE))
		syscall(SYS_sched_yield);
}

static void sig_unlock(const uint64_t *saved)
{
	__atomic_store_n(&g_sig_lock, 0, __ATOMIC_RELEASE);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, saved, NULL, 8);
}

/* glibc's definition of `name`, the one this library's hides. */
static void *next_symbol(void *volatile *cache, const char *name)
{
	void *p = *cache;
	if (!p) {
		p = dlsym(RTLD_NEXT, name);
		*cache = p;
	}
	return p;
}

typedef void (*handler_fn)(int);
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef handler_fn (*signal_fn)(int, handler_fn);
typedef int (*siginterrupt_fn)(int, int);

static void *volatile g_real_sigaction, *volatile g_real___sigaction, *volatile g_real_signal,
	*volatile g_real_bsd_signal, *volatile g_real_ssignal, *volatile g_real_sysv_signal,
	*volatile g_real___sysv_signal, *volatile g_real_siginterrupt,
	*volatile g_real_ptrace;

/* Whether the kernel runs the agent's handler for `sig` (then the program's view is the
 * shadow). */
static int agent_holds(int sig)
{
	struct ksigaction k;
	return k_sigaction(sig, NULL, &k) == 0 && k.handler == (void *)dump_handler;
}

/* The program's disposition of `sig` is the default now: remember it as the kernel keeps it
 * and install the agent's handler (through glibc, which adds its signal return trampoline).
 * Under the lock. */
static void take_signal(int sig)
{
	struct ksigaction k;
	sigaction_fn real = (sigaction_fn)next_symbol(&g_real_sigaction, "sigaction");
	if (!g_dump_armed || g_dumping || !real || k_sigaction(sig, NULL, &k) != 0 || k.handler != SIG_DFL)
		return;
	g_shadow[sig] = k;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = dump_handler;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigfillset(&sa.sa_mask);
	real(sig, &sa, NULL);
}

/* What glibc's sigaction() would have given the program for its own default action. */
static void show_shadow(int sig, struct sigaction *oact)
{
	oact->sa_handler = (handler_fn)g_shadow[sig].handler;
	oact->sa_flags = (int)g_shadow[sig].flags;
#if defined(__x86_64__)
	oact->sa_restorer = (void (*)(void))g_shadow[sig].restorer;
#endif
	memcpy(&oact->sa_mask, &g_shadow[sig].mask, 8);
}

static void arm_dump_signals(void)
{
	uint64_t m;
	sig_lock(&m);
	g_dump_armed = 1;
	for (int sig = 1; sig < 64; sig++)
		if (dump_signal(sig))
			take_signal(sig);
	sig_unlock(&m);
}

/* Puts the program's own dispositions back; the agent handles no core dump from now on. */
static void give_dump_signals_back(void)
{
	if (!g_dump_armed)
		return;
	uint64_t m;
	sig_lock(&m);
	g_dump_armed = 0;
	for (int sig = 1; sig < 64; sig++)
		if (dump_signal(sig) && agent_holds(sig))
			k_sigaction(sig, &g_shadow[sig], NULL);
	sig_unlock(&m);
}

/* Reads up to `cap - 1` bytes of a small file into `buf`, terminated; -1 if it cannot. */
static long read_small(const char *path, char *buf, size_t cap)
{
	long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	long n = syscall(SYS_read, fd, buf, cap - 1);
	syscall(SYS_close, fd);
	buf[n > 0 ? n : 0] = 0;
	return n;
}

/*
 * Whether the kernel would write a core for this process now (fs/coredump.c, vfs_coredump):
 * dumpable; a pattern that pipes to a helper ('|', unless RLIMIT_CORE is 1, the kernel's mark of
 * a helper's own crash) or to a socket ('@') whatever the limit, a file only with RLIMIT_CORE
 * of at least a page (binfmt_elf's min_coredump); and anonymous private memory in the dump
 * (coredump_filter bit 0). In doubt, yes: bringing the pages back for nothing costs time, a
 * core with holes is wrong.
 */
static int core_would_be_written(void)
{
	if (syscall(SYS_prctl, PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)
		return 0;
	char buf[32];
	if (read_small("/proc/self/coredump_filter", buf, sizeof buf) > 0) {
		unsigned long filter = 0;
		for (const char *c = buf; *c; c++) {
			int d = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10 : -1;
			if (d < 0)
				break;
			filter = filter * 16 + (unsigned long)d;
		}
		if (!(filter & 1))
			return 0;
	}
	struct { uint64_t cur, max; } lim;
	if (syscall(SYS_prlimit64, 0, RLIMIT_CORE, NULL, &lim) != 0)
		return 1;
	if (read_small("/proc/sys/kernel/core_pattern", buf, sizeof buf) <= 0)
		return 1;
	if (buf[0] == '|')
		return lim.cur != 1;
	if (buf[0] == '@')
		return 1;
	return lim.cur >= PAGE;
}

static void dump_handler(int sig, siginfo_t *info, void *ucv)
{
	int saved_errno = errno;
	if (core_would_be_written()) {
		uint8_t p[8];
		put32(p, 0);
		put32(p + 4, HOLD_DUMP);
		(void)ask_daemon_for(KIND_HOLD, p, sizeof p, 0);
	}
	uint64_t m;
	sig_lock(&m);
	g_dumping = 1;
	/* (Unless the program installed a handler of its own meanwhile: then it runs.) */
	if (agent_holds(sig))
		k_sigaction(sig, &g_shadow[sig], NULL);
	sig_unlock(&m);
	/* Delivered when this handler returns, whatever mask sigreturn puts back (a sigsuspend's
	 * caller may block it otherwise). */
	sigdelset(&((ucontext_t *)ucv)->uc_sigmask, sig);
	long pid = syscall(SYS_getpid), tid = syscall(SYS_gettid);
	if (syscall(SYS_rt_tgsigqueueinfo, pid, tid, sig, info) != 0)
		syscall(SYS_tgkill, pid, tid, sig);
	errno = saved_errno;
}

/* The interposed calls below: for a core-dumping signal, the real call under the lock, the
 * agent's handler shown as the shadow, and taken again if the program set the default. */

static int wrap_sigaction(void *volatile *cache, const char *name, int sig, const struct sigaction *act,
			  struct sigaction *oact)
{
	sigaction_fn real = (sigaction_fn)next_symbol(cache, name);
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	if (!dump_signal(sig) || !g_dump_armed)
		return real(sig, act, oact);
	uint64_t m;
	sig_lock(&m);
	int ours = agent_holds(sig);
	int r = real(sig, act, oact);
	int e = errno;
	if (r == 0) {
		if (ours && oact)
			show_shadow(sig, oact);
		if (act)
			take_signal(sig);
	}
	sig_unlock(&m);
	errno = e;
	return r;
}

__attribute__((visibility("default"))) int sigaction(int sig, const struct sigaction *act, struct sigaction *oact)
{
	return wrap_sigaction(&g_real_sigaction, "sigaction", sig, act, oact);
}

__attribute__((visibility("default"))) int __sigaction(int sig, const struct sigaction *act, struct sigaction *oact)
{
	return wrap_sigaction(&g_real___sigaction, "__sigaction", sig, act, oact);
}

static handler_fn wrap_signal(void *volatile *cache, const char *name, int sig, handler_fn h)
{
	signal_fn real = (signal_fn)next_symbol(cache, name);
	if (!real) {
		errno = ENOSYS;
		return SIG_ERR;
	}
	if (!dump_signal(sig) || !g_dump_armed)
		return real(sig, h);
	uint64_t m;
	sig_lock(&m);
	int ours = agent_holds(sig);
	handler_fn old = real(sig, h);
	int e = errno;
	if (old != SIG_ERR) {
		if (ours && (void *)old == (void *)dump_handler)
			old = (handler_fn)g_shadow[sig].handler;
		take_signal(sig);
	}
	sig_unlock(&m);
	errno = e;
	return old;
}

__attribute__((visibility("default"))) handler_fn signal(int sig, handler_fn h)
{
	return wrap_signal(&g_real_signal, "signal", sig, h);
}

__attribute__((visibility("default"))) handler_fn bsd_signal(int sig, handler_fn h)
{
	return wrap_signal(&g_real_bsd_signal, "bsd_signal", sig, h);
}

__attribute__((visibility("default"))) handler_fn ssignal(int sig, handler_fn h)
{
	return wrap_signal(&g_real_ssignal, "ssignal", sig, h);
}

__attribute__((visibility("default"))) handler_fn sysv_signal(int sig, handler_fn h)
{
	return wrap_signal(&g_real_sysv_signal, "sysv_signal", sig, h);
}

__attribute__((visibility("default"))) handler_fn __sysv_signal(int sig, handler_fn h)
{
	return wrap_signal(&g_real___sysv_signal, "__sysv_signal", sig, h);
}

/* sigset changes the signal mask too, which the lock must not cover: it is glibc's, written
 * with the calls it makes (sysdeps/posix/sigset.c), through the interposed sigaction. */
__attribute__((visibility("default"))) handler_fn sigset(int sig, handler_fn disp)
{
	sigset_t set, oset;
	struct sigaction act, oact;
	sigemptyset(&set);
	if (sigaddset(&set, sig) < 0)
		return SIG_ERR;
	if (disp == SIG_HOLD) {
		if (sigprocmask(SIG_BLOCK, &set, &oset) < 0)
			return SIG_ERR;
		if (sigismember(&oset, sig))
			return SIG_HOLD;
		if (sigaction(sig, NULL, &oact) < 0)
			return SIG_ERR;
		return oact.sa_handler;
	}
	act.sa_handler = disp;
	sigemptyset(&act.sa_mask);
	act.sa_flags = 0;
	if (sigaction(sig, &act, &oact) < 0)
		return SIG_ERR;
	if (sigprocmask(SIG_UNBLOCK, &set, &oset) < 0)
		return SIG_ERR;
	return sigismember(&oset, sig) ? SIG_HOLD : oact.sa_handler;
}

/* glibc's siginterrupt reads and writes back the disposition with SA_RESTART changed: the
 * agent's handler stays, the program's flags change in the shadow. */
__attribute__((visibility("default"))) int siginterrupt(int sig, int flag)
{
	siginterrupt_fn real = (siginterrupt_fn)next_symbol(&g_real_siginterrupt, "siginterrupt");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	if (!dump_signal(sig) || !g_dump_armed)
		return real(sig, flag);
	uint64_t m;
	sig_lock(&m);
	int ours = agent_holds(sig);
	int r = real(sig, flag);
	int e = errno;
	if (r == 0 && ours) {
		if (flag)
			g_shadow[sig].flags &= ~(unsigned long)SA_RESTART;
		else
			g_shadow[sig].flags |= SA_RESTART;
	}
	sig_unlock(&m);
	errno = e;
	return r;
}

/* syscall(SYS_rt_sigaction, ...) of the program's: the same, in the kernel's format. */
static long program_rt_sigaction(int sig, const void *act, void *oact, long size)
{
	if (!dump_signal(sig) || !g_dump_armed)
		return agent_syscall6(SYS_rt_sigaction, sig, (long)act, (long)oact, size, 0, 0);
	uint64_t m;
	sig_lock(&m);
	int ours = agent_holds(sig);
	long r = agent_syscall6(SYS_rt_sigaction, sig, (long)act, (long)oact, size, 0, 0);
	int e = errno;
	if (r == 0) {
		if (ours && oact)
			memcpy(oact, &g_shadow[sig], sizeof g_shadow[sig]);
		if (act)
			take_signal(sig);
	}
	sig_unlock(&m);
	errno = e;
	return r;
}

/* A seccomp filter is being installed: from now on the agent does nothing in program threads
 * (see atfork_child), and handles no core-dumping signal (its calls could be ones the filter
 * kills the process for, which would change how it dies). */
static void note_seccomp(void)
{
	if (g_agent)
		g_agent->filtered = 1;
	give_dump_signals_back();
}

static int ask_daemon(uint16_t kind, const uint8_t *payload, uint32_t len);

/* Whether thread `tid` of this process has ended. */
static int thread_gone(int tid)
{
	return tid <= 0 || (syscall(SYS_tgkill, syscall(SYS_getpid), tid, 0) < 0 && errno == ESRCH);
}

/*
 * A filter installed with SECCOMP_FILTER_FLAG_TSYNC reaches every thread, the agent's two too,
 * and any call of theirs (a recvmsg, a UFFDIO_MOVE, a poll) could be one the filter kills the
 * process for. So the process leaves management first: the daemon settles any DROP in flight,
 * closes the agent's connection (the agent thread ends on that, the watchdog within 100 ms),
 * brings back every page it evicted and unregisters everything. Once both threads are gone,
 * the filter is installed as the program asked, on the program's threads only. The process then
 * runs as one without an agent: its memory resident and counted by the daemon's census.
 */
static void leave_for_tsync(void)
{
	struct agent *ag = g_agent;
	if (!ag || ag->leaving)
		return;
	ag->filtered = 1;
	ag->leaving = 1;
	if (ask_daemon(KIND_LEAVE, NULL, 0) != 0) {
		say("uffd-agent: uffd-daemon did not take this process back before its seccomp filter "
		    "(TSYNC); the filter reaches the agent's threads\n");
		return;
	}
	/* Bounded: a thread that cannot end in 5 s (it never should) gets the filter too. */
	uint64_t deadline = now_us() + 5000000;
	while (!(thread_gone(ag->tid) && thread_gone(ag->watchdog_tid)) && now_us() < deadline) {
		struct timespec ts = { 0, 1000000 };
		syscall(SYS_nanosleep, &ts, NULL);
	}
	char line[200];
	snprintf(line, sizeof line,
		 "uffd-agent[%ld]: the program puts every thread under a seccomp filter (TSYNC), the "
		 "agent's too: its pages are back in memory and it runs unmanaged from now on\n",
		 syscall(SYS_getpid));
	say(line);
}

/* The program threads' side of "Per-thread credentials" (above agent_loop). */

#define CRED_FOLLOW_TIMEOUT_US 5000000

/* Whether prctl(option, arg2, ...) changes the calling thread's credentials. */
static int prctl_changes_creds(long option, long arg2)
{
	switch (option) {
	case PR_SET_KEEPCAPS:
	case PR_SET_SECUREBITS:
	case PR_CAPBSET_DROP:
	case PR_SET_NO_NEW_PRIVS:
		return 1;
	case PR_CAP_AMBIENT:
		return arg2 == PR_CAP_AMBIENT_RAISE || arg2 == PR_CAP_AMBIENT_LOWER ||
		       arg2 == PR_CAP_AMBIENT_CLEAR_ALL;
	}
	return 0;
}

static const char *cred_change_name(long nr, long option)
{
	if (nr == SYS_capset)
		return "capset";
	switch (option) {
	case PR_SET_KEEPCAPS:
		return "prctl(PR_SET_KEEPCAPS)";
	case PR_SET_SECUREBITS:
		return "prctl(PR_SET_SECUREBITS)";
	case PR_CAPBSET_DROP:
		return "prctl(PR_CAPBSET_DROP)";
	case PR_SET_NO_NEW_PRIVS:
		return "prctl(PR_SET_NO_NEW_PRIVS)";
	}
	return "prctl(PR_CAP_AMBIENT)";
}

/* Said once per process: the agent's threads may now make a later set*id differently. */
static void cred_say_once(struct cred_follow *cf, const char *what, const char *why)
{
	if (__atomic_exchange_n(&cf->said, 1, __ATOMIC_RELAXED))
		return;
	char line[400];
	snprintf(line, sizeof line,
		 "uffd-agent[%ld]: the agent's threads did not follow the program's %s (%s); a later "
		 "setuid, setgid or setgroups of the program may abort it (glibc makes those in every "
		 "thread and aborts when their results differ)\n",
		 syscall(SYS_getpid), what, why);
	say(line);
}

/* The id of the agent's thread `who` if it is running and following, else 0. */
static int cred_follower(struct agent *ag, int who)
{
	int tid = who == CRED_AGENT ? (ag->agent_running ? ag->tid : 0) : ag->watchdog_tid;
	return thread_gone(tid) ? 0 : tid;
}

/* Wakes the agent's thread `tid` through its eventfd `fd`, borrowed from its own descriptor
 * table for the write (a thread pidfd; without one the thread looks every 100 ms). */
static void cred_wake(int tid, int fd)
{
	if (fd < 0)
		return;
	int pfd = own_thread_pidfd(tid);
	if (pfd < 0)
		return;
	int efd = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
	syscall(SYS_close, pfd);
	if (efd < 0)
		return;
	uint64_t one = 1;
	syscall(SYS_write, efd, &one, sizeof one);
	syscall(SYS_close, efd);
}

/* In program thread `me`, which has just made the change `c`, successfully: has the agent's
 * threads make it too, and waits until they have (CRED_FOLLOW_TIMEOUT_US at most: they never
 * wait for a program thread, but one could be held up in a DROP by a stopped daemon). */
static void follow_in_agent_threads(struct agent *ag, const struct cred_change *c, int me)
{
	struct cred_follow *cf = &ag->cred;
	uint32_t s = cf->seq + 2;
	__atomic_store_n(&cf->seq, s - 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memcpy(&cf->change, c, sizeof *c);
	__atomic_store_n(&cf->seq, s, __ATOMIC_RELEASE);
	int tid[2];
	for (int who = 0; who < 2; who++) {
		tid[who] = cred_follower(ag, who);
		if (tid[who] == me) {
			/* The watchdog running the program's exit handlers: it made the change itself. */
			cf->err[who] = 0;
			__atomic_store_n(&cf->done[who], s, __ATOMIC_RELEASE);
			tid[who] = 0;
		} else if (tid[who]) {
			cred_wake(tid[who], cf->wake_fd[who]);
		}
	}
	const char *name = cred_change_name(c->nr, c->arg[0]);
	uint64_t deadline = now_us() + CRED_FOLLOW_TIMEOUT_US;
	for (;;) {
		int acks = __atomic_load_n(&cf->acks, __ATOMIC_ACQUIRE);
		int pending = 0;
		for (int who = 0; who < 2; who++)
			if (tid[who] && __atomic_load_n(&cf->done[who], __ATOMIC_ACQUIRE) != s &&
			    cred_follower(ag, who) == tid[who])
				pending = 1;
		if (!pending)
			break;
		if (now_us() >= deadline) {
			cred_say_once(cf, name, "not made within 5 s");
			return;
		}
		struct timespec ts = { 0, 20 * 1000000 };
		syscall(SYS_futex, &cf->acks, FUTEX_WAIT, acks, &ts, NULL, 0);
	}
	for (int who = 0; who < 2; who++)
		if (tid[who] && cf->done[who] == s && cf->err[who]) {
			cred_say_once(cf, name, strerror(cf->err[who]));
			break;
		}
}

/* Takes the lock for thread `me`: 0, or 1 if `me` holds it already (a signal handler that
 * interrupted this thread's own change). The lock word is the holder's id, set in one step, so
 * that a handler never waits for its own thread. */
static int cred_lock(volatile int *owner, int me)
{
	for (;;) {
		int cur = 0;
		if (__atomic_compare_exchange_n(owner, &cur, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return 0;
		if (cur == me)
			return 1;
		syscall(SYS_futex, owner, FUTEX_WAIT, cur, NULL, NULL, 0);
	}
}

static void cred_unlock(volatile int *owner)
{
	__atomic_store_n(owner, 0, __ATOMIC_RELEASE);
	futex_wake(owner);
}

/*
 * capset(2), or a prctl(2) for which prctl_changes_creds holds, made for the calling program
 * thread and, if it succeeded, followed in the agent's threads before it returns. Changes are
 * made one at a time, so that the agent's threads make them in the program's order. Made as
 * asked only, with nothing more, under a seccomp filter (the agent makes no call in program
 * threads then) and in a vfork child (it shares this state with a parent whose agent's threads
 * are not its own).
 */
static long cred_change_call(long nr, long a, long b, long c, long d, long e)
{
	struct agent *ag = g_agent;
	if (!ag || ag->filtered || (pid_t)syscall(SYS_getpid) != ag->cred.pid)
		return agent_syscall6(nr, a, b, c, d, e, 0);
	struct cred_follow *cf = &ag->cred;
	int me = (int)syscall(SYS_gettid);
	if (cred_lock(&cf->owner, me)) {
		/* A signal handler interrupting this thread's own change: made, not followed (that
		 * would tear the other), and said. */
		long r = agent_syscall6(nr, a, b, c, d, e, 0);
		if (r >= 0) {
			int saved = errno;
			cred_say_once(cf, cred_change_name(nr, a), "made in a signal handler during another");
			errno = saved;
		}
		return r;
	}
	long r = agent_syscall6(nr, a, b, c, d, e, 0);
	if (r >= 0) {
		int saved = errno;
		struct cred_change ch;
		memset(&ch, 0, sizeof ch);
		ch.nr = nr;
		if (nr == SYS_capset) {
			/* The kernel has just read both, and found the version valid. */
			const struct cap_header_ *h = (const struct cap_header_ *)a;
			ch.version = h->version;
			memcpy(ch.data, (const void *)b, (ch.version == CAP_VERSION_1_ ? 1 : 2) * sizeof ch.data[0]);
		} else {
			ch.arg[0] = a;
			ch.arg[1] = b;
			ch.arg[2] = c;
			ch.arg[3] = d;
			ch.arg[4] = e;
		}
		follow_in_agent_threads(ag, &ch, me);
		errno = saved;
	}
	cred_unlock(&cf->owner);
	return r;
}

/* libc's capset (libcap-ng's capng_apply, used by setpriv, calls it). */
__attribute__((visibility("default"))) int capset(void *hdrp, void *datap)
{
	return (int)cred_change_call(SYS_capset, (long)hdrp, (long)datap, 0, 0, 0);
}

/*
 * Calls the kernel allows only to a process of one thread (6.12's sources, and each checked on
 * this 6.18 machine with a thread of the program's and with the agent's threads):
 *   - unshare(CLONE_NEWUSER), which implies CLONE_THREAD | CLONE_FS, and unshare(CLONE_THREAD,
 *     CLONE_SIGHAND or CLONE_VM), which a process of one thread may ask for as no-ops: EINVAL
 *     unless the caller is the only thread (kernel/fork.c, ksys_unshare, check_unshare_flags);
 *   - setns into a user namespace: EINVAL unless the only thread and its fs_struct unshared
 *     (kernel/user_namespace.c, userns_install); into a mount namespace: EINVAL unless the
 *     fs_struct is unshared (fs/namespace.c, mntns_install; glibc's threads share it, CLONE_FS);
 *     into a time namespace: EUSERS unless the only thread (kernel/time/namespace.c,
 *     timens_install). Through a namespace's file, or a pidfd with those flags.
 * Every other unshare flag and setns target is allowed to a process of many threads (CLONE_FS
 * and CLONE_NEWNS copy the caller's fs_struct; CLONE_NEWPID and CLONE_NEWTIME reach only
 * children), and so is clone(CLONE_NEWUSER), which makes a new process.
 *
 * The agent's two threads made every managed process one of three, so these failed under the
 * daemon and worked bare (unshare -U, unshare -r, sandboxes). Now, when the caller is the
 * program's only thread, the agent's threads step out for the call: the daemon settles a DROP in
 * flight and closes the agent's connection (STEP_OUT; it keeps the process's uffd, so the
 * registrations and every stored page stay, and faults are served meanwhile; nothing of the
 * process is evicted until the agent is back), the agent thread ends on that and the watchdog
 * on a flag; the call is made; then the agent's threads start again from the calling thread,
 * with its new credentials, and greet the daemon as a fork child does (HELLO_AGENT_RESTART, on a
 * connection made before the call, since a mount namespace entered may not have the daemon's
 * socket), receiving the process's uffd back. A call the kernel refuses changes nothing, and the
 * threads come back the same way. The program's signals are blocked meanwhile (but glibc's two),
 * so no handler runs in the window (they are delivered after it: a few milliseconds late) and no
 * fork child copies it. If the agent cannot come back, the process leaves management (LEAVE:
 * every evicted page brought back first) and runs unmanaged from then on, said; if the daemon
 * would not let the agent step out, the call is made as it is, and fails as it did.
 *
 * Nothing changes for the daemon's view of the process in a new user namespace: its pid is the
 * same (a new pid namespace reaches only children), the peer credentials of the new connection
 * are read in the daemon's namespaces, and the daemon, root in the initial user namespace, keeps
 * its access to /proc/PID and its uffd. The agent's own calls (pidfd_getfd of its threads'
 * descriptors) are within one thread group, which ptrace's checks always allow.
 *
 * Not done: a program with other threads of its own (the call fails, as it does bare), a
 * program under a seccomp filter (the agent makes no call in its threads; the call fails as
 * before), a vfork child (it shares this state with its parent, whose threads these are: the
 * call is made as it is, and succeeds, as the child has no thread of the agent's), a call made
 * with a raw system call instruction.
 */
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif
#define NS_GET_NSTYPE_ _IO(0xb7, 0x3)
#define NSFS_MAGIC_ 0x6e736673
#define ALONE_UNSHARE (CLONE_NEWUSER | CLONE_THREAD | CLONE_SIGHAND | CLONE_VM)
#define ALONE_SETNS (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWTIME)
#define STEP_OUT_TIMEOUT_US 5000000

/* Whether setns(fd, nstype) needs the process alone: the type asked for, or else the type of
 * the namespace file (a pidfd needs a type: the kernel refuses 0). The type is asked of nsfs
 * files only: no other file gets the ioctl. */
static int setns_needs_alone(long fd, long nstype)
{
	if (nstype != 0)
		return (nstype & ALONE_SETNS) != 0;
	int saved = errno;
	struct statfs fs;
	long t = -1;
	if (syscall(SYS_fstatfs, fd, &fs) == 0 && fs.f_type == NSFS_MAGIC_)
		t = syscall(SYS_ioctl, fd, NS_GET_NSTYPE_);
	errno = saved;
	return t > 0 && (t & ALONE_SETNS) != 0;
}

/* The threads of this process (-1 if /proc cannot tell). */
static long process_threads(void)
{
	int saved = errno;
	long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/stat", O_RDONLY | O_CLOEXEC);
	long n = -1;
	if (fd >= 0) {
		char state;
		n = stat_threads((int)fd, &state);
		syscall(SYS_close, fd);
	}
	errno = saved;
	return n;
}

/* In the only program thread, its signals blocked: ends the agent's threads (`agent`,
 * `watchdog`: their ids, 0 for one not running). 0 once both are gone; -1 if the daemon did not
 * let the agent thread go (nothing changed then), -2 if a thread did not end in 5 s. */
static int agent_step_out(struct agent *ag, int agent, int watchdog)
{
	if (agent && ag->agent_running) {
		/* The daemon settles a DROP in flight and closes the connection: the agent thread
		 * ends on that, quietly (`closing`). */
		ag->closing = 1;
		if (ask_daemon(KIND_STEP_OUT, NULL, 0) != 0) {
			ag->closing = 0;
			return -1;
		}
	}
	ag->stepping_out = 1;
	if (watchdog)
		cred_wake(watchdog, ag->cred.wake_fd[CRED_WATCHDOG]);
	uint64_t deadline = now_us() + STEP_OUT_TIMEOUT_US;
	while (!(thread_gone(agent) && thread_gone(watchdog))) {
		if (now_us() > deadline)
			return -2;
		struct timespec ts = { 0, 200000 };
		syscall(SYS_nanosleep, &ts, NULL);
	}
	return 0;
}

/* Whether this process may start threads: not once unshare(CLONE_NEWPID) has put its
 * children in a new pid namespace, since the kernel refuses a thread whose pid namespace would
 * not be its leader's (kernel/fork.c, copy_process: EINVAL, bare too). The link to the
 * children's namespace names another one then, or none (ENOENT) until its first process (its
 * reaper) exists. 1 if /proc cannot tell. */
static int threads_allowed(void)
{
	char a[64], b[64];
	int saved = errno;
	long n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/ns/pid", a, sizeof a);
	long m = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/ns/pid_for_children", b, sizeof b);
	int none = m < 0 && errno == ENOENT;
	errno = saved;
	if (n <= 0)
		return 1;
	if (m <= 0)
		return !none;
	return n == m && memcmp(a, b, (size_t)n) == 0;
}

/* After the call: starts the agent's threads again from the calling thread (so with its
 * credentials and namespaces); the agent thread greets the daemon on `*sock` (made before the
 * call; -1: it connects itself) and receives the process's uffd. 0 once it has. `*sock` is
 * left to the caller (for its LEAVE) if no agent thread took it, else -1. */
static int agent_step_in(struct agent *ag, int *sock)
{
	ag->closing = 0;
	ag->stepping_out = 0;
	ag->sock = *sock;
	ag->uffd = -1;
	ag->boot_lifeline = -1;
	ag->lifeline = -1;
	ag->fork_child = 1;
	ag->greet_flags = HELLO_AGENT_RESTART;
	ag->greeted = 0;
	if (start_threads(ag) < 0)
		return -1;
	/* The agent thread has its own copy of the table: ours goes. */
	if (*sock >= 0)
		syscall(SYS_close, *sock);
	*sock = -1;
	while (ag->greeted == 0)
		syscall(SYS_futex, &ag->greeted, FUTEX_WAIT, 0, NULL, NULL, 0);
	return ag->greeted > 0 ? 0 : -1;
}

static int ask_daemon_on(int sock, uint16_t kind, const uint8_t *payload, uint32_t len);

/* The agent's threads cannot come back after `call` (`why`): the process leaves management
 * (the daemon brings every evicted page back first, as for a TSYNC filter) and runs without an
 * agent from then on; said. Asked on `sock` if it is open (made before the call), else on a new
 * connection. If the daemon cannot be asked, its faults are still served (the daemon holds its
 * uffd) but nothing is evicted, and the watchdog, if it runs, stays. */
static void agent_leave_after(struct agent *ag, const char *call, const char *why, int sock)
{
	int left = ask_daemon_on(sock, KIND_LEAVE, NULL, 0) == 0;
	char line[400];
	if (left) {
		ag->filtered = 1; /* no agent work in program threads, nor in fork children */
		ag->leaving = 1;
		int watchdog = thread_gone(ag->watchdog_tid) ? 0 : ag->watchdog_tid;
		if (watchdog)
			cred_wake(watchdog, ag->cred.wake_fd[CRED_WATCHDOG]);
		snprintf(line, sizeof line,
			 "uffd-agent[%ld]: the agent's threads cannot start again after %s (%s): its pages "
			 "are back in memory and it runs unmanaged from now on\n",
			 syscall(SYS_getpid), call, why);
	} else {
		snprintf(line, sizeof line,
			 "uffd-agent[%ld]: the agent's threads cannot start again after %s (%s), and "
			 "uffd-daemon could not be asked to take the process back: its pages are served "
			 "but no longer evicted\n",
			 syscall(SYS_getpid), call, why);
	}
	say(line);
}

/* unshare(2) or setns(2) (`nr`), made with the agent's threads out of the process when the call
 * needs it alone (above). */
static long alone_call(long nr, long a, long b)
{
	struct agent *ag = g_agent;
	int needs = nr == SYS_unshare ? (a & ALONE_UNSHARE) != 0 : setns_needs_alone(a, b);
	if (!needs || !ag || ag->filtered || (pid_t)syscall(SYS_getpid) != ag->cred.pid)
		return agent_syscall6(nr, a, b, 0, 0, 0, 0);
	int me = (int)syscall(SYS_gettid);
	int agent = thread_gone(ag->tid) ? 0 : ag->tid;
	int watchdog = thread_gone(ag->watchdog_tid) ? 0 : ag->watchdog_tid;
	/* Not from one of the agent's threads (the watchdog running the program's exit handlers),
	 * and not when the program has other threads: the kernel refuses the call whatever the
	 * agent does, as it does bare. */
	long threads = process_threads();
	if ((!agent && !watchdog) || me == agent || me == watchdog ||
	    (threads >= 0 && threads != 1 + (agent != 0) + (watchdog != 0)))
		return agent_syscall6(nr, a, b, 0, 0, 0, 0);
	const char *call = nr == SYS_unshare ? "unshare" : "setns";
	uint64_t all = ~((1ULL << (32 - 1)) | (1ULL << (33 - 1))), old;
	syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &old, sizeof old);
	long r;
	int e;
	int out = agent_step_out(ag, agent, watchdog);
	if (out == -1) {
		r = agent_syscall6(nr, a, b, 0, 0, 0, 0);
		e = errno;
		char line[300];
		snprintf(line, sizeof line,
			 "uffd-agent[%ld]: %s needs a process of one thread, and uffd-daemon did not let the "
			 "agent's threads step out: it is made with them\n",
			 syscall(SYS_getpid), call);
		say(line);
	} else {
		/* Connected before the call: a mount namespace it enters may lack the daemon's socket. */
		int sock = connect_daemon();
		r = agent_syscall6(nr, a, b, 0, 0, 0, 0);
		e = errno;
		const char *why = NULL;
		if (out != 0)
			why = "they did not end within 5 s";
		else if (!threads_allowed())
			why = "its children are to be in a new pid namespace, and the kernel then lets it "
			      "start no thread";
		else if (agent_step_in(ag, &sock) != 0)
			why = "they could not start or greet uffd-daemon";
		if (why)
			agent_leave_after(ag, call, why, sock);
		else if (sock >= 0)
			syscall(SYS_close, sock);
	}
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof old);
	errno = e;
	return r;
}

__attribute__((visibility("default"))) int unshare(int flags)
{
	return (int)alone_call(SYS_unshare, flags, 0);
}

__attribute__((visibility("default"))) int setns(int fd, int nstype)
{
	return (int)alone_call(SYS_setns, fd, nstype);
}

#undef syscall
__attribute__((visibility("default"))) long syscall(long n, ...)
{
	va_list ap;
	va_start(ap, n);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
	long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
	va_end(ap);
	if (n == SYS_seccomp && a == 1 /* SECCOMP_SET_MODE_FILTER */) {
		note_seccomp();
		if (b & 1 /* SECCOMP_FILTER_FLAG_TSYNC */)
			leave_for_tsync();
	}
	if (n == SYS_prctl && a == PR_SET_SECCOMP && b == 2 /* SECCOMP_MODE_FILTER */)
		note_seccomp();
	if (n == SYS_capset || (n == SYS_prctl && prctl_changes_creds(a, b)))
		return cred_change_call(n, a, b, c, d, e);
	if (n == SYS_unshare || n == SYS_setns)
		return alone_call(n, a, b);
	if (n == SYS_rt_sigaction)
		return program_rt_sigaction((int)a, (const void *)b, (void *)c, d);
	return agent_syscall6(n, a, b, c, d, e, f);
}
#define syscall agent_syscall

__attribute__((visibility("default"))) int prctl(int option, ...)
{
	va_list ap;
	va_start(ap, option);
	unsigned long a = va_arg(ap, unsigned long), b = va_arg(ap, unsigned long);
	unsigned long c = va_arg(ap, unsigned long), d = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_SECCOMP && a == 2 /* SECCOMP_MODE_FILTER */)
		note_seccomp();
	if (prctl_changes_creds(option, (long)a))
		return (int)cred_change_call(SYS_prctl, option, (long)a, (long)b, (long)c, (long)d);
	return (int)agent_syscall6(SYS_prctl, option, (long)a, (long)b, (long)c, (long)d, 0);
}

static int ask_daemon_timed(int sock, uint16_t kind, const uint8_t *payload, uint32_t len, int timeout_s);

/* Sends one request of `kind` to the daemon on a connection of this thread's own (closed at
 * once) and waits for its answer: 0 if it answered status 0. */
static int ask_daemon(uint16_t kind, const uint8_t *payload, uint32_t len)
{
	return ask_daemon_on(-1, kind, payload, len);
}

/* ask_daemon on `sock`, a connection made earlier and not used yet (closed here), or on a new
 * one if it is -1. */
static int ask_daemon_on(int sock, uint16_t kind, const uint8_t *payload, uint32_t len)
{
	return ask_daemon_timed(sock, kind, payload, len, GREETING_TIMEOUT_S);
}

/* ask_daemon, waiting `timeout_s` seconds at most for the answer (0: as long as it takes). */
static int ask_daemon_for(uint16_t kind, const uint8_t *payload, uint32_t len, int timeout_s)
{
	return ask_daemon_timed(-1, kind, payload, len, timeout_s);
}

/* The request itself. Raw system calls and the caller's stack only: a signal handler asks. */
static int ask_daemon_timed(int sock, uint16_t kind, const uint8_t *payload, uint32_t len, int timeout_s)
{
	if (sock < 0)
		sock = connect_daemon();
	if (sock < 0)
		return -1;
	uint8_t pkt[HEADER_LEN + 24];
	if (len > 24) {
		syscall(SYS_close, sock);
		return -1;
	}
	header(pkt, kind, len);
	if (len)
		memcpy(pkt + HEADER_LEN, payload, len);
	int rc = -1;
	struct timeval tv = { .tv_sec = timeout_s, .tv_usec = 0 };
	if (timeout_s > 0)
		syscall(SYS_setsockopt, sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (send_packet(sock, pkt, HEADER_LEN + len, -1) == 0) {
		uint8_t ans[HEADER_LEN + 64];
		ssize_t n = recv_packet(sock, ans, sizeof ans, NULL);
		uint32_t l;
		const uint8_t *ack = check_packet(ans, n, KIND_HELLO_ACK, &l);
		if (ack && l == 8 && get32(ack) == 0)
			rc = 0;
	}
	syscall(SYS_close, sock);
	return rc;
}

/*
 * ptrace: a debugger reads and writes its tracee's memory through /proc/PID/mem and
 * PEEKDATA/POKEDATA, which get EIO on a page the daemon evicted or never saw touched. A
 * tracer of the tree (gdb -p, strace -p run under the daemon) asks the daemon first to bring
 * the tracee's pages back and hand its memory to the kernel while it is traced (HOLD,
 * HOLD_TRACE), and attaches once that is done: nothing it reads is missing. The daemon ends the
 * hold when no thread of the tracee is traced any more. (PTRACE_TRACEME is not asked about: an
 * exec follows, and the daemon sees the new image traced when it greets.)
 */
#define PTRACE_ATTACH_ 16
#define PTRACE_SEIZE_ 0x4206
__attribute__((visibility("default"))) long ptrace(int req, ...)
{
	va_list ap;
	va_start(ap, req);
	pid_t pid = va_arg(ap, pid_t);
	void *addr = va_arg(ap, void *);
	void *data = va_arg(ap, void *);
	va_end(ap);
	long (*real)(int, ...) = (long (*)(int, ...))next_symbol(&g_real_ptrace, "ptrace");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	if ((req == PTRACE_ATTACH_ || req == PTRACE_SEIZE_) && pid > 0 && g_agent && !g_agent->filtered) {
		int e = errno;
		uint8_t p[8];
		put32(p, (uint32_t)pid);
		put32(p + 4, HOLD_TRACE);
		(void)ask_daemon(KIND_HOLD, p, sizeof p);
		errno = e;
	}
	return real(req, pid, addr, data);
}

/*
 * open of the process's own memory file: /proc/PID/mem gets EIO on a page the daemon evicted or
 * never saw touched (the kernel's remote access cannot wait for a userfault), and a program that
 * reads or writes its own memory through it (a JIT patching code, ksm's selftests writing to
 * PROT_NONE pages) is no tracer the daemon would see. So opening it asks the daemon first to
 * bring this process's pages back and hand its memory to the kernel (HOLD, HOLD_SELF_MEM), and
 * opens once that is done; the daemon ends the hold when no descriptor of the process names a
 * memory file any more. Only the paths that name this process: /proc/self/mem,
 * /proc/thread-self/mem, /proc/PID/mem and /proc/{self,PID}/task/TID/mem.
 */
static int names_own_mem(const char *path)
{
	if (!path || strncmp(path, "/proc/", 6) != 0)
		return 0;
	size_t n = strlen(path);
	if (n < 10 || strcmp(path + n - 4, "/mem") != 0)
		return 0;
	const char *who = path + 6;
	if (!strncmp(who, "self/", 5) || !strncmp(who, "thread-self/", 12))
		return 1;
	long pid = 0;
	const char *c = who;
	while (*c >= '0' && *c <= '9' && pid < 1L << 31)
		pid = pid * 10 + (*c++ - '0');
	return c > who && *c == '/' && pid == (long)syscall(SYS_getpid);
}

static void own_mem_hold(const char *path)
{
	if (!g_agent || g_agent->filtered || !names_own_mem(path))
		return;
	int e = errno;
	uint8_t p[8];
	put32(p, 0);
	put32(p + 4, HOLD_SELF_MEM);
	(void)ask_daemon(KIND_HOLD, p, sizeof p);
	errno = e;
}

static void *volatile g_real_open, *volatile g_real_open64, *volatile g_real_openat,
	*volatile g_real_openat64;
typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

/* The mode argument, present only with O_CREAT or O_TMPFILE. */
#define OPEN_MODE(flags, last)                               \
	mode_t mode = 0;                                     \
	if ((flags) & (O_CREAT | __O_TMPFILE)) {             \
		va_list ap;                                  \
		va_start(ap, last);                          \
		mode = (mode_t)va_arg(ap, int);              \
		va_end(ap);                                  \
	}

__attribute__((visibility("default"))) int open(const char *path, int flags, ...)
{
	OPEN_MODE(flags, flags);
	own_mem_hold(path);
	open_fn real = (open_fn)next_symbol(&g_real_open, "open");
	if (!real)
		return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
	return real(path, flags, mode);
}

__attribute__((visibility("default"))) int open64(const char *path, int flags, ...)
{
	OPEN_MODE(flags, flags);
	own_mem_hold(path);
	open_fn real = (open_fn)next_symbol(&g_real_open64, "open64");
	if (!real)
		return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
	return real(path, flags, mode);
}

__attribute__((visibility("default"))) int openat(int dirfd, const char *path, int flags, ...)
{
	OPEN_MODE(flags, flags);
	own_mem_hold(path);
	openat_fn real = (openat_fn)next_symbol(&g_real_openat, "openat");
	if (!real)
		return (int)syscall(SYS_openat, dirfd, path, flags, mode);
	return real(dirfd, path, flags, mode);
}

__attribute__((visibility("default"))) int openat64(int dirfd, const char *path, int flags, ...)
{
	OPEN_MODE(flags, flags);
	own_mem_hold(path);
	openat_fn real = (openat_fn)next_symbol(&g_real_openat64, "openat64");
	if (!real)
		return (int)syscall(SYS_openat, dirfd, path, flags, mode);
	return real(dirfd, path, flags, mode);
}

/* Asks the daemon to hand [start, start+len) over to the program's own userfaultfd: it brings
 * back what it evicted there and unregisters the range. 0 on success. */
static int release_to_program(uint64_t start, uint64_t len)
{
	uint8_t p[16];
	put64(p, start);
	put64(p + 8, len);
	return ask_daemon(KIND_RELEASE, p, sizeof p);
}

/*
 * mlock and friends: the kernel promises that locked pages never reach swap. The daemon's
 * census leaves locked mappings alone, but sees a lock only at its next scan (100 ms): a page
 * chosen for eviction meanwhile would be stored once. So the daemon is told first (LOCK), and
 * answers once no eviction of this process is in flight and none of the range can be chosen;
 * a lock that then fails withdraws the request. Nothing is asked under a seccomp filter.
 */
static void lock_ask(uint64_t start, uint64_t len, uint32_t flags)
{
	if (!g_agent || g_agent->filtered || len == 0)
		return;
	uint8_t p[24];
	put64(p, start);
	put64(p + 8, len);
	put32(p + 16, flags);
	put32(p + 20, 0);
	(void)ask_daemon(KIND_LOCK, p, sizeof p);
}

/*
 * madvise(MADV_REMOVE) on shared anonymous memory punches its pages (they read as zeros after),
 * MADV_DONTNEED only unmaps them (they keep their contents), and both raise the same REMOVE
 * event: the daemon, which may hold pages of the range evicted, is told which one this is before
 * the call and that it returned after it. Other advice goes straight to the kernel.
 */
static void shmem_remove_ask(const void *addr, size_t len, uint32_t flags)
{
	uint64_t s = (uint64_t)addr & ~(uint64_t)(PAGE - 1);
	uint64_t e = ((uint64_t)addr + len + PAGE - 1) & ~(uint64_t)(PAGE - 1);
	if (!g_agent || g_agent->filtered || e <= s || e > USER_END)
		return;
	uint8_t p[24];
	put64(p, s);
	put64(p + 8, e - s);
	put32(p + 16, flags);
	put32(p + 20, 0);
	(void)ask_daemon(KIND_SHMEM_REMOVE, p, sizeof p);
}

__attribute__((visibility("default"))) int madvise(void *addr, size_t len, int advice)
{
	if (advice != MADV_REMOVE)
		return (int)syscall(SYS_madvise, addr, len, advice);
	int saved = errno;
	shmem_remove_ask(addr, len, 0);
	errno = saved;
	long r = syscall(SYS_madvise, addr, len, advice);
	saved = errno;
	shmem_remove_ask(addr, len, SHMEM_REMOVE_DONE);
	errno = saved;
	return (int)r;
}

static void lock_range_ask(const void *addr, size_t len, int on)
{
	uint64_t s = (uint64_t)addr & ~(uint64_t)(PAGE - 1);
	uint64_t e = ((uint64_t)addr + len + PAGE - 1) & ~(uint64_t)(PAGE - 1);
	if (e > s && e <= USER_END)
		lock_ask(s, e - s, on ? LOCK_ON : 0);
}

__attribute__((visibility("default"))) int mlock2(const void *addr, size_t len, unsigned int flags)
{
	lock_range_ask(addr, len, 1);
	long r = syscall(SYS_mlock2, addr, len, flags);
	if (r != 0) {
		int e = errno;
		lock_range_ask(addr, len, 0);
		errno = e;
	}
	return (int)r;
}

__attribute__((visibility("default"))) int mlock(const void *addr, size_t len)
{
	return mlock2(addr, len, 0);
}

__attribute__((visibility("default"))) int mlockall(int flags)
{
	/* MCL_FUTURE: mappings made through mmap() here are left alone; the census finds the
	 * others (malloc's, brk) locked before it registers them. */
	if (flags & MCL_CURRENT)
		lock_ask(0, USER_END, LOCK_ON);
	if ((flags & MCL_FUTURE) && g_agent)
		g_agent->lock_future = 1;
	long r = syscall(SYS_mlockall, flags);
	if (r != 0) {
		int e = errno;
		if (flags & MCL_CURRENT)
			lock_ask(0, USER_END, 0);
		if (g_agent)
			g_agent->lock_future = 0;
		errno = e;
	}
	return (int)r;
}

__attribute__((visibility("default"))) int munlockall(void)
{
	long r = syscall(SYS_munlockall);
	if (r == 0 && g_agent)
		g_agent->lock_future = 0;
	return (int)r;
}

/*
 * ioctl: a program that registers memory with a userfaultfd of its own gets EBUSY where the
 * daemon's uffd has registered that memory first. Then the daemon steps aside (see
 * release_to_program) and the program's registration is tried again: the program's memory is
 * then its own to handle, as it would be without the daemon.
 */
#define UFFDIO_REGISTER_IOCTL 0xc020aa00UL
#define UFFDIO_MOVE_IOCTL 0xc028aa05UL
__attribute__((visibility("default"))) int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	/* The program moves pages out of memory the daemon may manage (UFFDIO_MOVE's source need
	 * not be registered with the program's uffd): the kernel tells the daemon nothing of a
	 * move, so the daemon first brings back what it evicted there and steps aside. */
	if (req == UFFDIO_MOVE_IOCTL && g_agent && !g_agent->filtered && arg) {
		struct uffdio_move_ mv;
		memcpy(&mv, arg, sizeof mv);
		(void)release_to_program(mv.src, mv.len);
	}
	long r = agent_syscall6(SYS_ioctl, fd, (long)req, (long)arg, 0, 0, 0);
	if (r < 0 && errno == EBUSY && req == UFFDIO_REGISTER_IOCTL && g_agent && !g_agent->filtered && arg) {
		struct uffdio_register_ reg;
		memcpy(&reg, arg, sizeof reg);
		if (release_to_program(reg.range.start, reg.range.len) == 0)
			r = agent_syscall6(SYS_ioctl, fd, (long)req, (long)arg, 0, 0, 0);
		else
			errno = EBUSY;
	}
	return (int)r;
}

/* A new userfaultfd of this process (syscall, else /dev/userfaultfd), or -1. */
static int new_uffd(void)
{
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd >= 0)
		return uffd;
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -1;
	uffd = ioctl(dev, _IO(0xAA, 0x00), O_CLOEXEC | O_NONBLOCK);
	close(dev);
	return uffd;
}

/* The process runs without the agent: said once, never silently. */
static void unmanaged(struct agent *ag, const char *why, int err)
{
	char line[300];
	snprintf(line, sizeof line, "uffd-agent[%d]: %s (%s); this process runs unmanaged\n", (int)getpid(), why,
		 err ? strerror(err) : "failed");
	say(line);
	if (ag->sock >= 0)
		close(ag->sock);
}

/* glibc's definitions behind the interposed calls, looked up now rather than at a first call
 * that may come from a signal handler (dlsym takes the loader's lock). */
static void find_next_symbols(void)
{
	static const struct { void *volatile *cache; const char *name; } next[] = {
		{ &g_real_sigaction, "sigaction" },	    { &g_real___sigaction, "__sigaction" },
		{ &g_real_signal, "signal" },		    { &g_real_bsd_signal, "bsd_signal" },
		{ &g_real_ssignal, "ssignal" },		    { &g_real_sysv_signal, "sysv_signal" },
		{ &g_real___sysv_signal, "__sysv_signal" }, { &g_real_siginterrupt, "siginterrupt" },
		{ &g_real_ptrace, "ptrace" },
	};
	for (size_t i = 0; i < sizeof next / sizeof next[0]; i++)
		(void)next_symbol(next[i].cache, next[i].name);
}

__attribute__((constructor)) static void uffd_agent_init(void)
{
	find_next_symbols();
	const char *path = getenv("UFFD_DAEMON_SOCK");
	const char *dpid = getenv("UFFD_DAEMON_PID");
	const char *dns = getenv("UFFD_DAEMON_PIDNS");
	if (!path || !*path || !dpid)
		return; /* not started by uffd-daemon */
	if (strlen(path) >= sizeof g_sock_path)
		fatal("UFFD_DAEMON_SOCK is too long", ENAMETOOLONG);
	strcpy(g_sock_path, path);

	char *region = mmap(NULL, REGION_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED)
		fatal("cannot map the agent region", errno);
	struct agent *ag = (struct agent *)(region + PAGE + SCRATCH_PAGES * PAGE);
	memset(ag, 0, sizeof *ag);
	ag->region = region;
	ag->probe = region;
	ag->scratch = region + PAGE;
	ag->stack = region + PAGE + SCRATCH_PAGES * PAGE + STATE_BYTES;
	ag->watchdog_stack = ag->stack + STACK_BYTES;
	/* Empty in every fork child, so that a child's probe read always faults, whatever its
	 * parent's probe page held (the daemon's token while the parent was being bound: bind.rs;
	 * a parent under a seccomp filter never empties it). Best effort: atfork_child empties the
	 * page after its greeting anyway. */
	madvise(ag->probe, PAGE, MADV_WIPEONFORK);
	ag->daemon_pid = (pid_t)atoi(dpid);
	if (dns && strlen(dns) < sizeof ag->daemon_pidns)
		strcpy(ag->daemon_pidns, dns);
	ag->boot_lifeline = -1;
	ag->lifeline = -1;

	ag->sock = -1;
	if (!threads_allowed()) {
		/* exec'd after unshare(CLONE_NEWPID) (unshare -p without --fork): the agent's threads
		 * cannot start. Its children, each in the new pid namespace, may. */
		unmanaged(ag, "its children are to be in a new pid namespace, and the kernel then lets it "
			      "start no thread",
			  EINVAL);
		return;
	}
	ag->sock = connect_daemon();
	if (ag->sock < 0) {
		unmanaged(ag, "cannot connect to uffd-daemon", errno);
		return;
	}
	uint32_t flags = 0;
	int uffd = new_uffd();
	if (uffd >= 0) {
		struct uffdio_api_ api = { .api = 0xAA, .features = FEATURES };
		if (ioctl(uffd, UFFDIO_API_, &api) == 0) {
			ag->features = api.features;
		} else if (errno == EPERM) {
			/* EVENT_FORK needs CAP_SYS_PTRACE, which this process lacks (a privilege drop
			 * before the exec): a fresh uffd, whose API the daemon does. */
			close(uffd);
			uffd = new_uffd();
			flags = HELLO_API_BY_DAEMON;
		} else {
			fatal("UFFDIO_API refused the features the daemon needs (MOVE needs Linux 6.8)", errno);
		}
	}
	if (uffd < 0) {
		/* No access to userfaultfd(2) or /dev/userfaultfd for this user: borrow the device. */
		int dev = -1;
		if (hello(ag, HELLO_NEED_UFFD, -1, &dev, NULL) < 0 || dev < 0) {
			unmanaged(ag, "cannot make a userfaultfd, and the daemon lent none", errno);
			return;
		}
		uffd = ioctl(dev, _IO(0xAA, 0x00), O_CLOEXEC | O_NONBLOCK);
		close(dev);
		if (uffd < 0) {
			unmanaged(ag, "USERFAULTFD_IOC_NEW on the daemon's /dev/userfaultfd", errno);
			return;
		}
		flags = HELLO_API_BY_DAEMON;
	}
	ag->uffd = uffd;
	if (!(flags & HELLO_API_BY_DAEMON)) {
		/* Probe and scratch are registered by the agent itself (or by the daemon with the API);
		 * the daemon never manages them. */
		struct uffdio_register_ reg = { .range = { (uint64_t)ag->probe, PAGE + SCRATCH_PAGES * PAGE },
						.mode = 1 };
		if (ioctl(uffd, UFFDIO_REGISTER_, &reg) < 0)
			fatal("registering the agent's scratch area", errno);
	}
	if (hello(ag, flags, uffd, NULL, &ag->boot_lifeline) < 0) {
		/* Not answered in time, refused, or the daemon out of descriptors: the process runs
		 * unmanaged. The daemon may still take the uffd and serve its faults; with no agent
		 * nothing is evicted, so nothing can be lost either way. */
		unmanaged(ag, errno == ETIMEDOUT ? "uffd-daemon did not answer the greeting in 10 s"
						 : "uffd-daemon did not accept this process",
			  errno);
		close(uffd);
		return;
	}
	if (start_threads(ag) < 0)
		fatal("cannot start the agent's threads (the agent thread with a descriptor table of its own)", errno);
	/* The agent thread holds the socket, the uffd and the daemon's lifeline in its own table now,
	 * the watchdog the lifeline in its own: nothing of the agent's stays in the program's. */
	close(ag->sock);
	close(uffd);
	if (ag->boot_lifeline >= 0)
		close(ag->boot_lifeline);
	ag->boot_lifeline = -1;
	/* The heap as it is now was registered with the greeting; its growth from here on is
	 * registered by the allocation wrappers. */
	g_brk_seen = (uintptr_t)sbrk(0); /* (also sets __curbrk if nothing has yet) */
	g_agent = ag;
	pthread_atfork(NULL, NULL, atfork_child);
	arm_dump_signals();
}
