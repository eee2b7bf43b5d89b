/*
 * A program whose memory is read from outside: by the kernel writing its core file, by gdb,
 * by a tracer of its own (tests/inspection.rs). It fills a buffer with a pattern every word of
 * which is known (word i holds (i + 1) * 0x9E3779B97F4A7C15), prints where it is, and then:
 *
 *   inspect abort MIB           RLIMIT_CORE unlimited, abort(): a core file
 *   inspect quiet MIB           RLIMIT_CORE 0, abort(): no core with a file pattern
 *   inspect segv-thread MIB     first every disposition of a core-dumping signal read back and
 *                               changed as a program does (printed: the same bare and managed),
 *                               then RLIMIT_CORE 0 and a NULL write in a second thread
 *   inspect traced MIB READY    writes "ADDR LEN PID FRESH" to the file READY, waits for
 *                               SIGUSR1 (a tracer looks meanwhile), then checks its memory and
 *                               the words the tracer wrote, and fills as much again
 *   inspect gdb-child MIB OUT   a child runs gdb -p on this process, which dumps the buffer to
 *                               OUT; then checks its memory
 *   inspect tracer PID ADDR LEN FRESH
 *                               attaches to PID, reads [ADDR, ADDR+LEN) through /proc/PID/mem
 *                               (retrying EIO for 30 s) and PEEKDATA, writes a word with
 *                               POKEDATA at ADDR + 3 pages and at FRESH (a page never touched),
 *                               reads them back, detaches
 *
 * "buffer ADDR LEN PID" is the first line of the output in every mode but tracer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Called on purpose: programs still call them, and the agent interposes them. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
extern __sighandler_t bsd_signal(int sig, __sighandler_t handler);

#define PAGE 4096UL
#define POKE_EVICTED 0x1122334455667788ULL
#define POKE_FRESH 0x99aabbccddeeff00ULL

static uint64_t pattern(uint64_t word) { return (word + 1) * 0x9E3779B97F4A7C15ULL; }

static uint64_t *fill(size_t mib)
{
	size_t len = mib << 20;
	uint64_t *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	for (size_t i = 0; i < len / 8; i++)
		b[i] = pattern(i);
	return b;
}

/* Words of `b` that do not hold the pattern, but for `skip` (which must hold `want`). */
static size_t bad_words(const uint64_t *b, size_t len, const volatile uint64_t *skip, uint64_t want)
{
	size_t bad = 0;
	for (size_t i = 0; i < len / 8; i++) {
		if (&b[i] == skip)
			bad += b[i] != want;
		else
			bad += b[i] != pattern(i);
	}
	return bad;
}

static void core_limit(rlim_t v)
{
	struct rlimit r = { v, v };
	if (setrlimit(RLIMIT_CORE, &r) != 0) {
		perror("setrlimit");
		exit(2);
	}
}

static void say_buffer(const void *b, size_t mib)
{
	printf("buffer %#lx %#lx %d\n", (unsigned long)b, (unsigned long)(mib << 20), (int)getpid());
	fflush(stdout);
}

/* ---- Dispositions, as a program reads and changes them ------------------------------------ */

static const int core_signals[] = { SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS,
				    SIGFPE,  SIGSEGV, SIGXCPU, SIGXFSZ, SIGSYS };

static void show(const char *what, int sig)
{
	struct sigaction o;
	memset(&o, 0x5a, sizeof o);
	if (sigaction(sig, NULL, &o) != 0) {
		printf("%s %d: sigaction failed: %s\n", what, sig, strerror(errno));
		return;
	}
	const char *h = o.sa_handler == SIG_DFL ? "SIG_DFL" : o.sa_handler == SIG_IGN ? "SIG_IGN" : "handler";
	uint64_t mask;
	memcpy(&mask, &o.sa_mask, 8);
	printf("%s %d: %s flags %#x mask %#lx restorer %s\n", what, sig, h, o.sa_flags, (unsigned long)mask,
	       o.sa_restorer ? "set" : "none");
}

/* Addresses nothing is mapped at (through a volatile pointer: the compiler must not see it). */
static int *volatile nowhere = (int *)16;

static sigjmp_buf recover;
static volatile int segv_code;
static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	segv_code = si->si_code;
	siglongjmp(recover, 1);
}
static void on_plain(int sig) { (void)sig; }

static void *show_in_thread(void *arg)
{
	(void)arg;
	show("thread", SIGSEGV);
	return NULL;
}

static void dispositions(void)
{
	for (size_t i = 0; i < sizeof core_signals / sizeof core_signals[0]; i++)
		show("start", core_signals[i]);
	/* The default action with flags and a mask of the program's. */
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_DFL;
	sa.sa_flags = SA_NODEFER | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGUSR1);
	memset(&old, 0x5a, sizeof old);
	sigaction(SIGSEGV, &sa, &old);
	printf("old SIGSEGV handler is %s, flags %#x\n", old.sa_handler == SIG_DFL ? "SIG_DFL" : "other", old.sa_flags);
	show("default with flags", SIGSEGV);
	/* A handler of the program's: it gets its own fault. */
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO;
	memset(&old, 0x5a, sizeof old);
	sigaction(SIGSEGV, &sa, &old);
	printf("old SIGSEGV flags %#x\n", old.sa_flags);
	show("own handler", SIGSEGV);
	if (sigsetjmp(recover, 1) == 0)
		*nowhere = 1;
	printf("recovered from SIGSEGV, si_code %d\n", segv_code);
	printf("signal() gave back %s\n", signal(SIGSEGV, SIG_DFL) == SIG_DFL ? "SIG_DFL" : "the handler");
	show("signal(SIG_DFL)", SIGSEGV);
	printf("signal() gave back %s\n", signal(SIGSEGV, SIG_DFL) == SIG_DFL ? "SIG_DFL" : "the handler");
	siginterrupt(SIGSEGV, 1);
	show("siginterrupt", SIGSEGV);
	siginterrupt(SIGSEGV, 0);
	show("siginterrupt 0", SIGSEGV);
	printf("sigset() gave back %s\n", sigset(SIGABRT, SIG_DFL) == SIG_DFL ? "SIG_DFL" : "other");
	printf("sysv_signal() gave back %s\n", sysv_signal(SIGQUIT, SIG_IGN) == SIG_DFL ? "SIG_DFL" : "other");
	show("sysv_signal(SIG_IGN)", SIGQUIT);
	printf("bsd_signal() gave back %s\n", bsd_signal(SIGQUIT, SIG_DFL) == SIG_IGN ? "SIG_IGN" : "other");
	show("bsd_signal(SIG_DFL)", SIGQUIT);
	printf("signal() gave back %s\n", signal(SIGTRAP, on_plain) == SIG_DFL ? "SIG_DFL" : "other");
	printf("signal() gave back %s\n", signal(SIGTRAP, SIG_DFL) == on_plain ? "the handler" : "other");
	struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } k;
	memset(&k, 0x5a, sizeof k);
	long r = syscall(SYS_rt_sigaction, SIGBUS, NULL, &k, 8);
	printf("rt_sigaction %ld: %s flags %#lx mask %#lx\n", r, k.handler == SIG_DFL ? "SIG_DFL" : "other", k.flags,
	       (unsigned long)k.mask);
	pthread_t t;
	pthread_create(&t, NULL, show_in_thread, NULL);
	pthread_join(t, NULL);
	fflush(stdout);
	pid_t c = fork();
	if (c == 0) {
		show("fork child", SIGSEGV);
		fflush(stdout);
		_exit(0);
	}
	waitpid(c, NULL, 0);
	for (size_t i = 0; i < sizeof core_signals / sizeof core_signals[0]; i++)
		show("end", core_signals[i]);
	fflush(stdout);
}

/* ---- Crashes ------------------------------------------------------------------------------- */

__attribute__((noinline)) static void crash_in_thread(void)
{
	*nowhere = 1;
}

static void *crasher(void *arg)
{
	(void)arg;
	crash_in_thread();
	return NULL;
}

/* ---- Tracing -------------------------------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int tracer(pid_t pid, uint64_t addr, uint64_t len, uint64_t fresh)
{
	if (ptrace(PTRACE_ATTACH, pid, 0, 0) != 0) {
		perror("PTRACE_ATTACH");
		return 1;
	}
	int st;
	if (waitpid(pid, &st, __WALL) != pid || !WIFSTOPPED(st)) {
		fprintf(stderr, "no stop after the attach\n");
		return 1;
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/mem", pid);
	int mem = open(path, O_RDWR);
	if (mem < 0) {
		perror(path);
		return 1;
	}
	/* Read it all; EIO is retried for 30 s (a tracer from outside the tree is seen by the
	 * daemon a little after its attach). */
	uint64_t *buf = malloc(len);
	double start = now_s();
	long eio = 0;
	uint64_t done = 0;
	while (done < len) {
		ssize_t n = pread(mem, (char *)buf + done, len - done, (off_t)(addr + done));
		if (n > 0) {
			done += (uint64_t)n;
			continue;
		}
		if (n < 0 && errno == EIO && now_s() - start < 30) {
			eio++;
			usleep(10000);
			continue;
		}
		printf("/proc/PID/mem at %#lx: %s (%ld EIO retried)\n", (unsigned long)(addr + done),
		       n < 0 ? strerror(errno) : "end of file", eio);
		return 1;
	}
	printf("read %lu bytes through /proc/PID/mem after %ld EIO (%s)\n", (unsigned long)len, eio,
	       eio ? "retried" : "none");
	size_t bad = bad_words(buf, len, NULL, 0);
	/* PEEKDATA: a word of every page. */
	size_t peek_bad = 0;
	for (uint64_t off = 0; off < len; off += PAGE) {
		errno = 0;
		long w = ptrace(PTRACE_PEEKDATA, pid, (void *)(addr + off), 0);
		if (errno != 0 || (uint64_t)w != pattern(off / 8)) {
			if (peek_bad++ == 0)
				printf("PEEKDATA at %#lx: %s\n", (unsigned long)(addr + off), errno ? strerror(errno) : "wrong");
		}
	}
	/* POKEDATA into an evicted page and into one never touched, read back. */
	int poke_bad = 0;
	if (ptrace(PTRACE_POKEDATA, pid, (void *)(addr + 3 * PAGE), (void *)POKE_EVICTED) != 0) {
		printf("POKEDATA at an evicted page: %s\n", strerror(errno));
		poke_bad++;
	}
	if (ptrace(PTRACE_POKEDATA, pid, (void *)fresh, (void *)POKE_FRESH) != 0) {
		printf("POKEDATA at a page never touched: %s\n", strerror(errno));
		poke_bad++;
	}
	uint64_t back[2] = { 0, 0 };
	if (pread(mem, &back[0], 8, (off_t)(addr + 3 * PAGE)) != 8 || back[0] != POKE_EVICTED)
		poke_bad++;
	if (pread(mem, &back[1], 8, (off_t)fresh) != 8 || back[1] != POKE_FRESH)
		poke_bad++;
	uint64_t zero = 1;
	if (pread(mem, &zero, 8, (off_t)(fresh + PAGE)) != 8 || zero != 0) {
		printf("a page never touched does not read as zeros\n");
		poke_bad++;
	}
	printf("%zu bad words read, %zu bad PEEKDATA, %d bad POKEDATA\n", bad, peek_bad, poke_bad);
	close(mem);
	if (ptrace(PTRACE_DETACH, pid, 0, 0) != 0) {
		perror("PTRACE_DETACH");
		return 1;
	}
	return bad || peek_bad || poke_bad;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: inspect MODE ARGS (see the header)\n");
		return 2;
	}
	const char *mode = argv[1];
	if (!strcmp(mode, "tracer") && argc == 6)
		return tracer(atoi(argv[2]), strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0),
			      strtoull(argv[5], NULL, 0));
	size_t mib = strtoul(argv[2], NULL, 0);
	if (!strcmp(mode, "abort") || !strcmp(mode, "quiet")) {
		core_limit(!strcmp(mode, "abort") ? RLIM_INFINITY : 0);
		uint64_t *b = fill(mib);
		say_buffer(b, mib);
		abort();
	}
	if (!strcmp(mode, "segv-thread")) {
		dispositions();
		core_limit(0); /* a pipe gets the core anyway */
		uint64_t *b = fill(mib);
		say_buffer(b, mib);
		pthread_t t;
		pthread_create(&t, NULL, crasher, NULL);
		pthread_join(t, NULL);
		return 0;
	}
	if (!strcmp(mode, "traced") && argc == 4) {
		sigset_t usr1;
		sigemptyset(&usr1);
		sigaddset(&usr1, SIGUSR1);
		sigprocmask(SIG_BLOCK, &usr1, NULL);
		uint64_t *b = fill(mib);
		char *fresh = mmap(NULL, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		say_buffer(b, mib);
		char tmp[4096];
		snprintf(tmp, sizeof tmp, "%s.part", argv[3]);
		FILE *f = fopen(tmp, "w");
		if (!f || fprintf(f, "%#lx %#lx %d %#lx\n", (unsigned long)b, (unsigned long)(mib << 20), (int)getpid(),
				  (unsigned long)fresh) < 0 || fclose(f) != 0 || rename(tmp, argv[3]) != 0) {
			perror(argv[3]);
			return 2;
		}
		int sig;
		sigwait(&usr1, &sig);
		size_t bad = bad_words(b, mib << 20, &b[3 * PAGE / 8], POKE_EVICTED);
		for (size_t i = 0; i < 16 * PAGE / 8; i++)
			bad += ((uint64_t *)fresh)[i] != (i == 0 ? POKE_FRESH : 0);
		/* Paged again once the tracer is gone: as much again. */
		uint64_t *more = fill(mib);
		bad += bad_words(more, mib << 20, NULL, 0);
		bad += bad_words(b, mib << 20, &b[3 * PAGE / 8], POKE_EVICTED);
		printf("%zu bad words after the tracer\n", bad);
		return bad != 0;
	}
	if (!strcmp(mode, "gdb-child") && argc == 4) {
		uint64_t *b = fill(mib);
		say_buffer(b, mib);
		char cmd[256], parent[16];
		snprintf(cmd, sizeof cmd, "dump binary memory %s %#lx %#lx", argv[3], (unsigned long)b,
			 (unsigned long)b + (mib << 20));
		snprintf(parent, sizeof parent, "%d", (int)getpid());
		fflush(stdout);
		pid_t c = fork();
		if (c == 0) {
			execlp("gdb", "gdb", "-nx", "-batch", "-iex", "set debuginfod enabled off", "-iex",
			       "set auto-load off", "-p", parent, "-ex", cmd, (char *)NULL);
			perror("gdb");
			_exit(127);
		}
		int st;
		waitpid(c, &st, 0);
		size_t bad = bad_words(b, mib << 20, NULL, 0);
		printf("gdb exited %d; %zu bad words after it\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1, bad);
		return bad != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	fprintf(stderr, "inspect: unknown mode %s\n", mode);
	return 2;
}
