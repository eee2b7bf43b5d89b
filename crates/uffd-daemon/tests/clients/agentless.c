/*
 * A program for the daemon's management of processes without an agent (built static by the
 * tests). Every mode writes and checks its own memory and exits non-zero on any wrong byte.
 *
 *   agentless page MIB [MS]      fill MIB MiB with a pattern, check it twice (then hold it MS
 *                                milliseconds)
 *   agentless fds MIB            page MIB MiB, then list the open descriptors ("fd N TARGET")
 *   agentless fork MIB N         fill MIB MiB, fork N children that each check the inherited
 *                                copy, rewrite half of it and check again; the parent checks
 *                                its copy after they exit
 *   agentless blocked KIND MIB   the main thread blocks in KIND (read, nanosleep, futex) while
 *                                another thread pages MIB MiB (so every injection stops the
 *                                main thread, the leader, inside that call); the call must
 *                                return exactly what it returns bare: no EINTR, the right bytes
 *   agentless seccomp-exec MIB   install an allow-all seccomp filter, then exec itself in
 *                                `page MIB` mode: the new image carries the filter
 *   agentless traced MIB         fork a child that asks to be traced (PTRACE_TRACEME) and
 *                                execs STATIC page MIB (STATIC from $AGENTLESS_STATIC); trace
 *                                it to its end (a debugger-like tracer)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t word(uint64_t seed, size_t i)
{
	return seed ^ (i * 0x9e3779b97f4a7c15ull);
}

static uint64_t *fill(size_t mib, uint64_t seed)
{
	size_t words = mib << 17;
	uint64_t *m = malloc(words * 8);
	if (!m) {
		perror("malloc");
		exit(2);
	}
	for (size_t i = 0; i < words; i++)
		m[i] = word(seed, i);
	return m;
}

static long check(const uint64_t *m, size_t from, size_t to, uint64_t seed)
{
	long bad = 0;
	for (size_t i = from; i < to; i++)
		if (m[i] != word(seed, i))
			bad++;
	return bad;
}

static int page(size_t mib, const char *who, int hold_ms)
{
	uint64_t *m = fill(mib, 11);
	long bad = check(m, 0, mib << 17, 11) + check(m, 0, mib << 17, 11);
	printf("%s: %zu MiB, %ld bad words\n", who, mib, bad);
	fflush(stdout);
	if (hold_ms)
		usleep(hold_ms * 1000); /* for the daemon's census (every 100 ms) to see it */
	free(m);
	return bad != 0;
}

static int forks(size_t mib, int n)
{
	size_t words = mib << 17;
	uint64_t *m = fill(mib, 5);
	pid_t kids[64];
	for (int k = 0; k < n && k < 64; k++) {
		kids[k] = fork();
		if (kids[k] < 0) {
			perror("fork");
			return 2;
		}
		if (kids[k] == 0) {
			long bad = check(m, 0, words, 5);
			uint64_t seed = 100 + k;
			for (size_t i = 0; i < words / 2; i++)
				m[i] = word(seed, i);
			bad += check(m, 0, words / 2, seed) + check(m, words / 2, words, 5);
			printf("child %d: %ld bad words\n", k, bad);
			fflush(stdout);
			_exit(bad != 0);
		}
	}
	int failed = 0;
	for (int k = 0; k < n && k < 64; k++) {
		int st;
		waitpid(kids[k], &st, 0);
		failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	long bad = check(m, 0, words, 5);
	printf("parent: %ld bad words, %d children failed\n", bad, failed);
	return bad != 0 || failed != 0;
}

struct blocked {
	size_t mib;
	int pipe_w;
	atomic_int futex_word;
	int rc;
};

static void *pager(void *arg)
{
	struct blocked *b = arg;
	b->rc = page(b->mib, "pager", 0);
	/* Unblock the main thread. */
	if (b->pipe_w >= 0) {
		static const char msg[] = "0123456789abcdef";
		if (write(b->pipe_w, msg, 16) != 16)
			b->rc = 1;
	}
	atomic_store(&b->futex_word, 1);
	syscall(SYS_futex, &b->futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	return NULL;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int blocked(const char *kind, size_t mib)
{
	struct blocked b = { .mib = mib, .pipe_w = -1 };
	int fds[2] = { -1, -1 };
	if (!strcmp(kind, "read")) {
		if (pipe(fds))
			return 2;
		b.pipe_w = fds[1];
	}
	pthread_t t;
	pthread_create(&t, NULL, pager, &b);
	int bad = 0;
	if (!strcmp(kind, "read")) {
		char buf[64];
		/* One read: it blocks until the pager writes, and gets all 16 bytes. */
		ssize_t n = read(fds[0], buf, sizeof buf);
		if (n != 16 || memcmp(buf, "0123456789abcdef", 16)) {
			printf("read returned %zd (%s)\n", n, n < 0 ? strerror(errno) : "short or wrong");
			bad = 1;
		}
	} else if (!strcmp(kind, "nanosleep")) {
		/* Sleeps of 50 ms in a row until the pager is done: each returns 0 and lasts at
		 * least its time (a restart after a stop continues the same sleep). */
		int sleeps = 0;
		while (!atomic_load(&b.futex_word)) {
			struct timespec req = { 0, 50 * 1000 * 1000 }, rem;
			double t0 = now_s();
			int r = nanosleep(&req, &rem);
			double took = now_s() - t0;
			if (r != 0 || took < 0.0499) {
				printf("nanosleep returned %d (%s) after %.4f s\n", r,
				       r ? strerror(errno) : "ok", took);
				bad = 1;
				break;
			}
			sleeps++;
		}
		printf("nanosleep: %d sleeps\n", sleeps);
	} else if (!strcmp(kind, "futex")) {
		/* A futex wait without a timeout returns 0 when woken, or EAGAIN if the word
		 * changed before it slept; never EINTR (it restarts). */
		while (!atomic_load(&b.futex_word)) {
			long r = syscall(SYS_futex, &b.futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
			if (r != 0 && errno != EAGAIN) {
				printf("futex returned %ld (%s)\n", r, strerror(errno));
				bad = 1;
				break;
			}
		}
	} else {
		fprintf(stderr, "unknown kind %s\n", kind);
		return 2;
	}
	pthread_join(t, NULL);
	printf("blocked %s: %s, pager %s\n", kind, bad ? "FAILED" : "exact", b.rc ? "FAILED" : "ok");
	return bad || b.rc;
}

static int seccomp_exec(const char *self, const char *mib)
{
	struct sock_filter allow[] = { BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
	struct sock_fprog prog = { .len = 1, .filter = allow };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) {
		perror("seccomp");
		return 2;
	}
	execl(self, self, "page", mib, "300", (char *)NULL);
	perror("exec");
	return 2;
}

static int traced(const char *mib)
{
	const char *target = getenv("AGENTLESS_STATIC");
	if (!target)
		return 2;
	pid_t c = fork();
	if (c == 0) {
		ptrace(PTRACE_TRACEME, 0, 0, 0);
		execl(target, target, "page", mib, "300", (char *)NULL);
		_exit(127);
	}
	int st;
	for (;;) {
		if (waitpid(c, &st, 0) < 0)
			return 2;
		if (WIFEXITED(st) || WIFSIGNALED(st))
			break;
		int sig = WSTOPSIG(st) == SIGTRAP ? 0 : WSTOPSIG(st);
		ptrace(PTRACE_CONT, c, 0, sig);
	}
	printf("traced child: %s %d\n", WIFEXITED(st) ? "exit" : "signal",
	       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}

static int fds(size_t mib)
{
	int rc = page(mib, "fds", 0);
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
			continue;
		char path[300], target[256];
		snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof target - 1);
		target[n < 0 ? 0 : n] = 0;
		char *b = strchr(target, '['); /* pipes and sockets: their kind only */
		if (b && strncmp(target, "anon_inode", 10))
			*b = 0;
		printf("fd %s %s\n", e->d_name, target);
	}
	closedir(d);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: agentless MODE ARGS\n");
		return 2;
	}
	const char *mode = argv[1];
	if (!strcmp(mode, "page"))
		return page(strtoul(argv[2], NULL, 10), "page", argc > 3 ? atoi(argv[3]) : 0);
	if (!strcmp(mode, "fds"))
		return fds(strtoul(argv[2], NULL, 10));
	if (!strcmp(mode, "fork") && argc > 3)
		return forks(strtoul(argv[2], NULL, 10), atoi(argv[3]));
	if (!strcmp(mode, "blocked") && argc > 3)
		return blocked(argv[2], strtoul(argv[3], NULL, 10));
	if (!strcmp(mode, "seccomp-exec"))
		return seccomp_exec("/proc/self/exe", argv[2]);
	if (!strcmp(mode, "traced"))
		return traced(argv[2]);
	fprintf(stderr, "unknown mode %s\n", mode);
	return 2;
}
