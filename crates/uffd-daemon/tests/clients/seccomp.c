/*
 * A program with a strict seccomp allow-list (unlisted calls fail with EPERM, as libseccomp's
 * SCMP_ACT_ERRNO does): it fills memory, maps more, forks a child that checks what it
 * inherited, and checks its own. Exits non-zero on any wrong word or a child that died.
 *
 *   seccomp MIB          the filter first (prctl), on the main thread only
 *   seccomp MIB tsync    the memory filled first, then the filter on every thread
 *                        (SECCOMP_FILTER_FLAG_TSYNC), killing the process for any unlisted call,
 *                        as sandboxes do
 */
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ALLOW(n) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, n, 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		ALLOW(SYS_read), ALLOW(SYS_write), ALLOW(SYS_exit), ALLOW(SYS_exit_group), ALLOW(SYS_brk),
		ALLOW(SYS_mmap), ALLOW(SYS_munmap), ALLOW(SYS_mprotect), ALLOW(SYS_futex),
		ALLOW(SYS_rt_sigreturn), ALLOW(SYS_rt_sigprocmask), ALLOW(SYS_newfstatat), ALLOW(SYS_fstat),
		ALLOW(SYS_clone), ALLOW(SYS_wait4), ALLOW(SYS_madvise), ALLOW(SYS_getpid),
		ALLOW(SYS_set_robust_list), ALLOW(SYS_clone3), ALLOW(SYS_gettid), ALLOW(SYS_clock_nanosleep),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1),
	};
	struct sock_fprog prog = { sizeof f / sizeof f[0], f };
	int tsync = argc > 2 && !strcmp(argv[2], "tsync");
	if (tsync)
		f[sizeof f / sizeof f[0] - 1].k = SECCOMP_RET_KILL_PROCESS;
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    (!tsync && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))) {
		perror("seccomp");
		return 2;
	}
	size_t n = mib << 17;
	unsigned long *m = malloc(n * 8);
	for (size_t i = 0; i < n; i++)
		m[i] = i * 7;
	if (tsync) {
		long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
		if (r != 0) {
			fprintf(stderr, "seccomp TSYNC: %ld (%m)\n", r);
			return 2;
		}
		/* Time for any thread of the process to make a call the filter kills it for. */
		struct timespec ts = { 0, 400 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	char *x = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(x, 1, 8 << 20);
	pid_t c = fork();
	if (c == 0) {
		long bad = 0;
		for (size_t i = 0; i < n; i++)
			bad += m[i] != i * 7;
		printf("child: %ld bad words\n", bad);
		fflush(stdout);
		sleep(3); /* long enough for the daemon's census to count it */
		_exit(bad != 0);
	}
	int st;
	waitpid(c, &st, 0);
	long bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += m[i] != i * 7;
	for (size_t i = 0; i < (8 << 20); i++)
		bad += x[i] != 1;
	printf("parent: %ld bad words, child %s %d\n", bad, WIFEXITED(st) ? "exited" : "killed by signal",
	       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return bad || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
