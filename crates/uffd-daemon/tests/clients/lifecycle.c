/*
 * A program doing to its own process what real programs do: closing its descriptors, listing
 * them, starting with 0-2 closed, ending its main thread with pthread_exit, dropping privileges
 * and forking. Every mode writes and checks its own memory, so that it pages under a small
 * limit, and exits non-zero on any wrong byte.
 *
 *   lifecycle fds OUT          list the open descriptors into OUT (one "fd target" a line)
 *   lifecycle closefrom MIB    close every descriptor above 2, then page MIB MiB
 *   lifecycle pthread-exit MIB the main thread calls pthread_exit while another pages MIB MiB
 *   lifecycle drop-fork MIB    page MIB MiB, drop to uid/gid 65534, fork a child that pages
 *                              MIB MiB more, checks the inherited MiB and execs `inner`
 *   lifecycle inner MIB        page MIB MiB
 *   lifecycle mlock MIB        mlock 4 MiB and fill it with a secret marker, then page MIB MiB
 *                              of other memory, check the secret, print READY and wait for a
 *                              line on stdin
 *   lifecycle mlock-race MIB   20 rounds: fill 1 MiB with filler, let it go cold while
 *                              paging MIB MiB of other memory, mlock it and at once write a
 *                              secret marker into it; the daemon's reclaim is choosing victims
 *                              all the while. Checks every secret, prints READY and waits for a
 *                              line on stdin
 *   lifecycle shared MIB       fill MIB MiB of MAP_SHARED anonymous memory, check it, hold it a
 *                              moment (for the daemon's census)
 *   lifecycle heap MIB         fill MIB MiB in 64 KiB mallocs (glibc's main heap, grown by brk),
 *                              check it
 *   lifecycle fork-shared MIB KIB  fill MIB MiB, fork a child that exits at once (the pages
 *                              stay marked shared), fork a child that waits: wait until the two
 *                              hold at most KIB KiB of anonymous memory (10 s at most), check
 *                              the parent's data, then the child's
 *   lifecycle wipe-on-fork MIB map MIB MiB wipe-on-fork, MIB MiB dont-fork and MIB MiB plain,
 *                              fill all three (they page), fork: the child must read zeros,
 *                              no mapping and its parent's data
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t *fill(size_t mib, uint64_t seed)
{
	size_t words = mib << 17;
	uint64_t *m = malloc(words * 8);
	if (!m) {
		perror("malloc");
		exit(2);
	}
	for (size_t i = 0; i < words; i++)
		m[i] = seed ^ (i * 0x9e3779b97f4a7c15ull);
	return m;
}

static long check(const uint64_t *m, size_t mib, uint64_t seed)
{
	size_t words = mib << 17;
	long bad = 0;
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < words; i++)
			if (m[i] != (seed ^ (i * 0x9e3779b97f4a7c15ull)))
				bad++;
	return bad;
}

static int page(size_t mib, uint64_t seed, const char *who)
{
	uint64_t *m = fill(mib, seed);
	long bad = check(m, mib, seed);
	printf("%s: %zu MiB, %ld bad words\n", who, mib, bad);
	fflush(stdout);
	free(m);
	return bad != 0;
}

static long rss_anon_kib_of(const char *status)
{
	FILE *f = fopen(status, "r");
	char line[256];
	long kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "RssAnon: %ld", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static long rss_anon_kib(void)
{
	return rss_anon_kib_of("/proc/self/status");
}

static void list_fds(FILE *out)
{
	DIR *d = opendir("/proc/self/fd");
	int self = dirfd(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || atoi(e->d_name) == self)
			continue;
		char path[300], target[256];
		snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof target - 1);
		target[n < 0 ? 0 : n] = 0;
		/* pipes and sockets differ run to run by inode: keep their kind */
		char *b = strchr(target, '[');
		if (b)
			*b = 0;
		fprintf(out, "%s %s\n", e->d_name, target);
	}
	closedir(d);
}

static void *pager(void *arg)
{
	size_t mib = (size_t)arg;
	usleep(100 * 1000); /* the main thread is gone by now */
	int rc = page(mib, 7, "thread");
	if (rc)
		exit(1);
	return NULL; /* the last thread: the process ends with status 0 */
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: lifecycle MODE ARG\n");
		return 2;
	}
	const char *mode = argv[1];
	size_t mib = strtoul(argv[2], NULL, 10);
	if (!strcmp(mode, "fds")) {
		/* Open the output first: with 0-2 closed it takes one of them, as it would bare. */
		FILE *out = fopen(argv[2], "w");
		if (!out)
			return 2;
		list_fds(out);
		fclose(out);
		return page(16, 1, "fds");
	}
	if (!strcmp(mode, "closefrom")) {
		if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
			return 2;
		/* A fork child closes its descriptors too, then opens files of its own. */
		pid_t c = fork();
		if (c == 0) {
			syscall(SYS_close_range, 3, ~0U, 0);
			int a = open("/dev/null", O_RDONLY), b = open("/dev/zero", O_RDONLY);
			int rc = page(mib / 2, 3, "child");
			char ta[64] = "", tb[64] = "";
			char pa[64], pb[64];
			snprintf(pa, sizeof pa, "/proc/self/fd/%d", a);
			snprintf(pb, sizeof pb, "/proc/self/fd/%d", b);
			(void)!readlink(pa, ta, sizeof ta - 1);
			(void)!readlink(pb, tb, sizeof tb - 1);
			if (strcmp(ta, "/dev/null") || strcmp(tb, "/dev/zero")) {
				printf("child: fds %d %d are %s and %s\n", a, b, ta, tb);
				return 1;
			}
			return rc;
		}
		int rc = page(mib, 2, "parent");
		int st;
		waitpid(c, &st, 0);
		return rc || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	if (!strcmp(mode, "pthread-exit")) {
		pthread_t t;
		pthread_create(&t, NULL, pager, (void *)mib);
		pthread_exit(NULL);
	}
	if (!strcmp(mode, "drop-fork")) {
		uint64_t *m = fill(mib, 4);
		if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) {
			perror("dropping privileges");
			return 2;
		}
		pid_t c = fork();
		if (c == 0) {
			int rc = page(mib, 5, "dropped child");
			long bad = check(m, mib, 4);
			printf("dropped child: inherited %zu MiB, %ld bad words\n", mib, bad);
			fflush(stdout);
			if (rc || bad)
				return 1;
			execl("/proc/self/exe", argv[0], "inner", argv[2], (char *)NULL);
			perror("exec");
			return 2;
		}
		int st;
		waitpid(c, &st, 0);
		long bad = check(m, mib, 4);
		printf("dropped parent: %ld bad words, child status %d\n", bad,
		       WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		return bad || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	if (!strcmp(mode, "shared")) {
		size_t bytes = mib << 20;
		uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return 2;
		for (size_t i = 0; i < bytes / 8; i++)
			m[i] = i * 3;
		usleep(400 * 1000);
		long bad = 0;
		for (size_t i = 0; i < bytes / 8; i++)
			bad += m[i] != i * 3;
		printf("shared: %zu MiB, %ld bad words\n", mib, bad);
		return bad != 0;
	}
	if (!strcmp(mode, "mlock")) {
		size_t bytes = 4 << 20;
		char *secret = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (secret == MAP_FAILED)
			return 2;
		/* Locked first, then written: pages written before mlock may have reached swap, with
		 * the kernel's swap as with the daemon. */
		if (mlock(secret, bytes)) {
			perror("mlock");
			return 2;
		}
		usleep(300 * 1000);
		for (size_t i = 0; i < bytes; i += 64)
			memcpy(secret + i, "SECRET-MARKER-0123456789-abcdefghijklmnopqrstuvwxyz-0123456789!", 64);
		int rc = page(mib, 9, "mlock");
		long bad = 0;
		for (size_t i = 0; i < bytes; i += 64)
			bad += memcmp(secret + i, "SECRET-MARKER-0123456789-abcdefghijklmnopqrstuvwxyz-0123456789!", 64) != 0;
		unsigned char vec[1024];
		long absent = 0;
		if (mincore(secret, bytes, vec) == 0)
			for (size_t i = 0; i < bytes / 4096; i++)
				absent += !(vec[i] & 1);
		printf("mlock: secret %ld bad, %ld pages not resident\nREADY\n", bad, absent);
		fflush(stdout);
		char line[8];
		(void)!read(0, line, sizeof line);
		return rc || bad || absent;
	}
	if (!strcmp(mode, "mlock-race")) {
		static const char marker[64] = "LOCKED-BEFORE-WRITTEN-MARKER-0123456789-abcdefghijklmnopqrstuv!";
		enum { ROUNDS = 20, BYTES = 1 << 20 };
		char *r[ROUNDS];
		uint64_t *other = fill(mib, 11);
		size_t words = mib << 17;
		for (int k = 0; k < ROUNDS; k++) {
			r[k] = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (r[k] == MAP_FAILED)
				return 2;
			memset(r[k], 0x5a, BYTES);
			/* Cold: a pass over the other memory pushes reclaim past it. */
			for (size_t i = 0; i < words; i += 512)
				other[i] ^= 1;
			if (mlock(r[k], BYTES)) {
				perror("mlock");
				return 2;
			}
			for (size_t i = 0; i < BYTES; i += 64)
				memcpy(r[k] + i, marker, 64);
		}
		long bad = 0;
		for (int k = 0; k < ROUNDS; k++)
			for (size_t i = 0; i < BYTES; i += 64)
				bad += memcmp(r[k] + i, marker, 64) != 0;
		for (size_t i = 0; i < words; i += 512)
			other[i] ^= 0; /* touched once more: the mlock'd rounds stay resident */
		printf("mlock-race: %ld bad secrets\nREADY\n", bad);
		fflush(stdout);
		char line[8];
		(void)!read(0, line, sizeof line);
		return bad != 0;
	}
	if (!strcmp(mode, "heap")) {
		size_t n = mib * 16, sz = 64 * 1024;
		uint64_t **v = malloc(n * sizeof *v);
		for (size_t i = 0; i < n; i++) {
			v[i] = malloc(sz);
			for (size_t j = 0; j < sz / 8; j++)
				v[i][j] = i ^ (j * 0x9e3779b97f4a7c15ull);
		}
		long bad = 0;
		for (size_t i = 0; i < n; i++)
			for (size_t j = 0; j < sz / 8; j++)
				bad += v[i][j] != (i ^ (j * 0x9e3779b97f4a7c15ull));
		printf("heap: %zu MiB, %ld bad words\n", mib, bad);
		return bad != 0;
	}
	if (!strcmp(mode, "fork-shared")) {
		uint64_t *m = fill(mib, 5);
		/* A child that exits at once leaves the pages marked shared in the parent. */
		pid_t gone = fork();
		if (gone == 0)
			_exit(0);
		int st;
		waitpid(gone, &st, 0);
		/* A child that maps the same pages while both wait. */
		int go[2];
		if (pipe(go) != 0)
			return 2;
		pid_t waiter = fork();
		if (waiter == 0) {
			char c;
			close(go[1]);
			if (read(go[0], &c, 1) != 1)
				_exit(3);
			long cbad = check(m, mib, 5);
			printf("waiting child: %zu MiB, %ld bad words\n", mib, cbad);
			fflush(stdout);
			_exit(cbad != 0);
		}
		close(go[0]);
		/* The two together hold twice the limit's worth of shared pages: the kernel's view of
		 * both must come under the limit (limit_kib, the third argument) within 10 s. */
		long limit = argc > 3 ? strtol(argv[3], NULL, 10) : 0, sum = 0;
		int waited = 0;
		for (; waited < 10000; waited += 50) {
			char path[64];
			snprintf(path, sizeof path, "/proc/%d/status", (int)waiter);
			sum = rss_anon_kib() + rss_anon_kib_of(path);
			if (sum <= limit)
				break;
			usleep(50 * 1000);
		}
		printf("parent and child: %ld KiB anonymous resident after %d ms\n", sum, waited);
		long bad = check(m, mib, 5);
		printf("parent: %zu MiB, %ld bad words\n", mib, bad);
		fflush(stdout);
		if (write(go[1], "x", 1) != 1)
			return 2;
		waitpid(waiter, &st, 0);
		return bad != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	if (!strcmp(mode, "wipe-on-fork")) {
		size_t bytes = mib << 20;
		uint64_t *wf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t *dd = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (wf == MAP_FAILED || dd == MAP_FAILED || madvise(wf, bytes, MADV_WIPEONFORK) ||
		    madvise(dd, bytes, MADV_DONTFORK))
			return 2;
		for (size_t i = 0; i < bytes / 8; i++)
			wf[i] = dd[i] = ~i;
		uint64_t *plain = fill(mib, 8);
		pid_t c = fork();
		if (c == 0) {
			long nonzero = 0;
			for (size_t i = 0; i < bytes / 8; i++)
				nonzero += wf[i] != 0;
			/* msync fails with ENOMEM where nothing is mapped */
			int unmapped = msync(dd, 4096, MS_ASYNC) != 0 && errno == ENOMEM;
			long bad = check(plain, mib, 8);
			printf("child: %ld non-zero words where wipe-on-fork, dont-fork %s, %ld bad words\n", nonzero,
			       unmapped ? "unmapped" : "MAPPED", bad);
			fflush(stdout);
			return nonzero || !unmapped || bad;
		}
		int st;
		waitpid(c, &st, 0);
		long bad = check(plain, mib, 8);
		for (size_t i = 0; i < bytes / 8; i++)
			bad += (wf[i] != ~i) + (dd[i] != ~i);
		printf("parent: %ld bad words\n", bad);
		return bad || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	if (!strcmp(mode, "inner")) {
		int rc = page(mib, 6, "inner");
		uint64_t *m = fill(mib, 6); /* held a moment, for the daemon's census */
		usleep(300 * 1000);
		return rc || check(m, mib, 6);
	}
	fprintf(stderr, "lifecycle: unknown mode %s\n", mode);
	return 2;
}
