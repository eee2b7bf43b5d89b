/*
 * A program that enters new namespaces the way sandboxes do, with its memory paged before and
 * after: the calls the kernel allows only to a process of one thread (unshare(CLONE_NEWUSER);
 * setns into a user, mount or time namespace) failed under uffd-daemon with EINVAL, since the
 * agent's two threads made every managed process one of three.
 *
 *   userns MIB           the whole program, below
 *   userns MIB newpid    writes pattern A, unshares a user namespace and a pid namespace for
 *                        its children at once (unshare -Urp), then checks every word: the kernel
 *                        lets such a process start no thread, so the agent cannot come back and
 *                        the process leaves management with its pages brought back first
 *
 * 1. Writes MIB MiB, every 8-byte word its own value (pattern A).
 * 2. Children, each forked after that, make one such call each and then check every word of
 *    pattern A: setns into a user namespace, a mount namespace, a time namespace (made by a
 *    holder child that unshares all three), unshare(CLONE_THREAD | CLONE_SIGHAND | CLONE_VM)
 *    (no-ops to a process of one thread), and unshare(CLONE_NEWUSER) from a process with a
 *    thread of its own (refused, as bare).
 * 3. The process itself: unshare(CLONE_NEWUSER) with an invalid flag beside it (refused), then
 *    unshare(CLONE_NEWUSER), and maps its uid and gid to 0 there, as `unshare -r` does.
 * 4. After the call: checks every word of pattern A (pages evicted before the call come back),
 *    writes pattern B over every word and checks it (the process must be paged after the call:
 *    its anonymous RSS, sampled every MiB, is said on stderr), then forks a child that checks B
 *    and writes and checks pattern C in its copy.
 *
 * stdout is the same bare and under the daemon; stderr has the post-call RSS peak.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

static uint64_t *buf;
static size_t words;
static long rss_max_kib;

static uint64_t value(size_t i, uint64_t pattern)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL ^ pattern * 0xc2b2ae3d27d4eb4fULL;
	x ^= x >> 31;
	return x * 0x94d049bb133111ebULL;
}

static long rss_anon_kib(void)
{
	char line[256];
	long kib = -1;
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "RssAnon: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static void sample(size_t i)
{
	if (i % (1 << 17) == 0) { /* every MiB */
		long k = rss_anon_kib();
		if (k > rss_max_kib)
			rss_max_kib = k;
	}
}

static void fill(uint64_t pattern, int measure)
{
	for (size_t i = 0; i < words; i++) {
		buf[i] = value(i, pattern);
		if (measure)
			sample(i);
	}
}

static size_t check(uint64_t pattern, int measure)
{
	size_t bad = 0;
	for (size_t i = 0; i < words; i++) {
		bad += buf[i] != value(i, pattern);
		if (measure)
			sample(i);
	}
	return bad;
}

static const char *outcome(int r)
{
	static char s[64];
	if (r == 0)
		return "ok";
	snprintf(s, sizeof s, "%s", strerror(errno));
	return s;
}

static void *idle(void *arg)
{
	(void)arg;
	pause();
	return NULL;
}

/* In a child: makes one call (`what`), then checks pattern A; exits with the bad-word count
 * (capped), 100 if the child itself went wrong. */
static void child_call(const char *what, int holder)
{
	fflush(stdout);
	pid_t p = fork();
	if (p < 0) {
		perror("fork");
		exit(1);
	}
	if (p == 0) {
		int r;
		if (strncmp(what, "setns(", 6) == 0) {
			char path[64], ns[16];
			snprintf(ns, sizeof ns, "%.*s", (int)(strlen(what) - 7), what + 6);
			snprintf(path, sizeof path, "/proc/%d/ns/%s%s", holder, ns,
				 strcmp(ns, "time") == 0 ? "_for_children" : "");
			int fd = open(path, O_RDONLY | O_CLOEXEC);
			if (fd < 0) {
				perror(path);
				_exit(100);
			}
			r = setns(fd, 0);
		} else if (strcmp(what, "unshare(CLONE_THREAD|CLONE_SIGHAND|CLONE_VM)") == 0) {
			r = unshare(CLONE_THREAD | CLONE_SIGHAND | CLONE_VM);
		} else {
			/* unshare(CLONE_NEWUSER) with a thread of the program's own: refused */
			pthread_t t;
			if (pthread_create(&t, NULL, idle, NULL) != 0)
				_exit(100);
			r = unshare(CLONE_NEWUSER);
		}
		size_t bad = check(1, 0);
		printf("child %s: %s, %zu bad words\n", what, outcome(r), bad);
		fflush(stdout);
		_exit(bad > 99 ? 99 : (int)bad);
	}
	int st;
	waitpid(p, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		printf("child %s ended with status %#x\n", what, st);
		exit(1);
	}
}

static int write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, text, strlen(text));
	close(fd);
	return n == (ssize_t)strlen(text) ? 0 : -1;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
	words = mib << 17;
	buf = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	fill(1, 0);

	if (argc > 2 && strcmp(argv[2], "newpid") == 0) {
		int r = unshare(CLONE_NEWUSER | CLONE_NEWPID);
		printf("unshare(CLONE_NEWUSER|CLONE_NEWPID): %s\n", outcome(r));
		size_t bad = check(1, 0);
		printf("after the call: pattern A %zu bad words of %zu\n", bad, words);
		return r != 0 || bad != 0;
	}

	/* The namespaces to enter: a holder child makes them and waits. */
	int ready[2];
	if (pipe(ready) != 0)
		return 1;
	fflush(stdout);
	pid_t holder = fork();
	if (holder == 0) {
		int r = unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWTIME);
		char c = r == 0 ? 'y' : 'n';
		if (write(ready[1], &c, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char c = 0;
	if (read(ready[0], &c, 1) != 1 || c != 'y') {
		printf("holder: unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWTIME) failed\n");
		kill(holder, SIGKILL);
		return 1;
	}
	printf("holder: unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWTIME): ok\n");
	child_call("setns(user)", holder);
	child_call("setns(mnt)", holder);
	child_call("setns(time)", holder);
	child_call("unshare(CLONE_THREAD|CLONE_SIGHAND|CLONE_VM)", holder);
	child_call("unshare(CLONE_NEWUSER) beside a thread of its own", holder);
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);

	/* The process itself. A call the kernel refuses (an invalid flag) changes nothing. */
	int r = unshare(CLONE_NEWUSER | 0x1);
	printf("unshare(CLONE_NEWUSER|0x1): %s\n", outcome(r));
	uid_t uid = getuid();
	gid_t gid = getgid();
	r = unshare(CLONE_NEWUSER);
	printf("unshare(CLONE_NEWUSER): %s\n", outcome(r));
	if (r != 0)
		return 1;
	char map[64];
	snprintf(map, sizeof map, "0 %u 1\n", (unsigned)uid);
	int mapped = write_file("/proc/self/setgroups", "deny") == 0 && write_file("/proc/self/uid_map", map) == 0;
	snprintf(map, sizeof map, "0 %u 1\n", (unsigned)gid);
	mapped = mapped && write_file("/proc/self/gid_map", map) == 0;
	printf("mapped to uid %u gid %u in the new user namespace: %s\n", (unsigned)getuid(),
	       (unsigned)getgid(), mapped ? "ok" : "failed");

	size_t bad_a = check(1, 1);
	fill(2, 1);
	size_t bad_b = check(2, 1);
	printf("after the call: pattern A %zu bad words, pattern B %zu bad words, of %zu\n", bad_a, bad_b,
	       words);
	fflush(stdout);
	fprintf(stderr, "userns: RssAnon peak after the call: %ld kB\n", rss_max_kib);

	pid_t p = fork();
	if (p == 0) {
		size_t bad = check(2, 0);
		fill(3, 0);
		bad += check(3, 0);
		_exit(bad > 99 ? 99 : (int)bad);
	}
	int st;
	waitpid(p, &st, 0);
	printf("a child forked in the new namespace: status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	return bad_a || bad_b || !mapped || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
