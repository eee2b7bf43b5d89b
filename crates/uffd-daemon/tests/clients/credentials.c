/*
 * A program changing its credentials the way setpriv, capsh and daemons that keep a capability
 * do: the per-thread changes glibc does not make in every thread (capset, prctl's KEEPCAPS,
 * SECUREBITS, CAPBSET_DROP, CAP_AMBIENT, NO_NEW_PRIVS; through libc's functions and through
 * syscall()) between the ones it does (setresuid, setresgid, setgroups: SIGSETXID, and an abort
 * when the threads' results differ). Run as root.
 *
 *   credentials MIB    page MIB MiB, make the changes below one by one, printing after each the
 *                      calling thread's credentials and how many other threads of the process
 *                      have different ones (/proc/self/task/TID/status: ids, groups, the five
 *                      capability sets, no_new_privs); then fork a child that checks the same,
 *                      pages MIB MiB more, checks what it inherited and execs `exec-check`
 *   credentials exec-check MIB
 *                      the same check in a new image, which then drops its ambient and other
 *                      capabilities, changes its ids to the same ones (a broadcast) and pages
 *   credentials vfork 0
 *                      a vfork child (this process's memory, not its threads) sets
 *                      keepcaps and no_new_privs and execs: no thread of this process changes
 *   credentials diverged 0
 *                      the main thread locks its keepcaps flag (securebits), then a second
 *                      thread, started before and so unlocked, sets keepcaps: both succeed
 *
 * Exits 1 if any thread differs or a byte is wrong, 2 if a change fails that should not.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* <linux/capability.h> and <linux/securebits.h>, as the kernel defines them. */
struct cap_header { uint32_t version; int pid; };
struct cap_data { uint32_t effective, permitted, inheritable; };
#define CAP_V3 0x20080522
#define CAP_CHOWN 0
#define CAP_DAC_OVERRIDE 1
#define CAP_SETGID 6
#define CAP_SETUID 7
#define CAP_SETPCAP 8
#define CAP_NET_BIND_SERVICE 10
#define CAP_SYS_ADMIN 21
#define CAP_SYS_BOOT 22
#define SECBIT_NO_SETUID_FIXUP (1 << 2)
#define SECBIT_KEEP_CAPS (1 << 4)
#define SECBIT_KEEP_CAPS_LOCKED (1 << 5)
#define BIT(c) (1u << (c))

/* Through libc's symbol, as libcap-ng does (not declared by glibc's headers). */
extern int capset(struct cap_header *h, const struct cap_data *d);

static int failures;

/* mmap rather than malloc: the agent registers what the program maps before it is touched,
 * while a chunk malloc maps for itself can fill past the limit before the daemon's scan finds
 * it (ARCHITECTURE.md, accounting), which is not what this program tests. */
static uint64_t *fill(size_t mib, uint64_t seed)
{
	size_t words = mib << 17;
	uint64_t *m = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		perror("mmap");
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
	for (size_t i = 0; i < words; i++)
		if (m[i] != (seed ^ (i * 0x9e3779b97f4a7c15ull)))
			bad++;
	return bad;
}

/* The credential lines of a thread's status, in one string. */
static void creds_of(const char *status, char *out, size_t cap)
{
	static const char *keys[] = { "Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:",
				      "CapEff:", "CapBnd:", "CapAmb:", "NoNewPrivs:" };
	FILE *f = fopen(status, "r");
	char line[512];
	size_t n = 0;
	out[0] = 0;
	if (!f)
		return;
	while (fgets(line, sizeof line, f))
		for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
			if (!strncmp(line, keys[k], strlen(keys[k])) && n + strlen(line) < cap) {
				strcpy(out + n, line);
				n += strlen(line);
			}
	fclose(f);
}

/* How many other threads of this process have credentials other than the calling thread's
 * (the first difference goes to stderr). */
static int threads_differing(const char *step)
{
	char mine[2048], theirs[2048], path[128];
	snprintf(path, sizeof path, "/proc/self/task/%ld/status", (long)syscall(SYS_gettid));
	creds_of(path, mine, sizeof mine);
	DIR *d = opendir("/proc/self/task");
	if (!d) {
		perror("/proc/self/task");
		exit(2);
	}
	int differ = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || atol(e->d_name) == (long)syscall(SYS_gettid))
			continue;
		snprintf(path, sizeof path, "/proc/self/task/%ld/status", atol(e->d_name));
		creds_of(path, theirs, sizeof theirs);
		if (theirs[0] && strcmp(mine, theirs)) {
			if (!differ)
				fprintf(stderr, "%s: thread %s differs:\n%s-- this thread:\n%s", step, e->d_name,
					theirs, mine);
			differ++;
		}
	}
	closedir(d);
	return differ;
}

/* One line for a step: this thread's ids and capabilities, and the other threads' agreement. */
static void report(const char *step)
{
	uid_t r, e, s;
	gid_t gr, ge, gs;
	getresuid(&r, &e, &s);
	getresgid(&gr, &ge, &gs);
	struct cap_header h = { CAP_V3, 0 };
	struct cap_data c[2];
	syscall(SYS_capget, &h, c);
	int differ = threads_differing(step);
	failures += differ != 0;
	printf("%s: uid %u %u %u, gid %u %u %u, %d groups, eff %x prm %x inh %x, bset-boot %d, "
	       "ambient-nbs %d, secbits %x, nnp %d; other threads differing: %d\n",
	       step, r, e, s, gr, ge, gs, getgroups(0, NULL), c[0].effective, c[0].permitted,
	       c[0].inheritable, prctl(PR_CAPBSET_READ, CAP_SYS_BOOT, 0, 0, 0),
	       prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, CAP_NET_BIND_SERVICE, 0, 0),
	       prctl(PR_GET_SECUREBITS, 0, 0, 0, 0), prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), differ);
	fflush(stdout);
}

static void must(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "%s: %s\n", what, strerror(errno));
		exit(2);
	}
}

static int set_caps_libc(uint32_t eff, uint32_t prm, uint32_t inh)
{
	struct cap_header h = { CAP_V3, 0 };
	struct cap_data c[2] = { { eff, prm, inh }, { 0, 0, 0 } };
	return capset(&h, c);
}

static int set_caps_syscall(int pid, uint32_t eff, uint32_t prm, uint32_t inh)
{
	struct cap_header h = { CAP_V3, pid };
	struct cap_data c[2] = { { eff, prm, inh }, { 0, 0, 0 } };
	return (int)syscall(SYS_capset, &h, c);
}

static pthread_barrier_t locked;

static void *set_keepcaps(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&locked);
	int rc = prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
	printf("second thread: keepcaps %s\n", rc ? strerror(errno) : "set");
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: credentials MODE MIB\n");
		return 2;
	}
	size_t mib = strtoul(argv[2], NULL, 0);
	if (!strcmp(argv[1], "exec-check")) {
		report("exec'd image");
		must(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient clear");
		report("exec'd image: ambient cleared");
		must(set_caps_libc(0, 0, 0), "capset to nothing");
		report("exec'd image: capset to nothing");
		must(setresuid(65534, 65534, 65534) || setresgid(65534, 65534, 65534), "set*id");
		report("exec'd image: setresuid, setresgid to the same ids");
		uint64_t *m = fill(mib, 7);
		long bad = check(m, mib, 7);
		printf("exec'd image: %zu MiB, %ld bad words\n", mib, bad);
		return failures || bad ? 1 : 0;
	}
	if (!strcmp(argv[1], "vfork")) {
		pid_t c = vfork();
		if (c == 0) {
			if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
				_exit(2);
			execl("/bin/true", "true", (char *)NULL);
			_exit(2);
		}
		int st;
		waitpid(c, &st, 0);
		/* Time for a change wrongly handed to this process's other threads to be made there
		 * even unwoken (the agent's watchdog looks every 100 ms). */
		usleep(300 * 1000);
		report("after a vfork child's prctls");
		return failures || !WIFEXITED(st) || WEXITSTATUS(st) ? 1 : 0;
	}
	if (!strcmp(argv[1], "diverged")) {
		pthread_t t;
		pthread_barrier_init(&locked, NULL, 2);
		if (pthread_create(&t, NULL, set_keepcaps, NULL))
			return 2;
		must(prctl(PR_SET_SECUREBITS, SECBIT_KEEP_CAPS_LOCKED, 0, 0, 0), "PR_SET_SECUREBITS");
		printf("main thread: keepcaps locked\n");
		fflush(stdout);
		pthread_barrier_wait(&locked);
		pthread_join(t, NULL);
		return 0;
	}
	if (strcmp(argv[1], "drop"))
		return 2;
	uint64_t *m = fill(mib, 4);
	report("start");
	must(prctl(PR_CAPBSET_DROP, CAP_SYS_BOOT, 0, 0, 0), "PR_CAPBSET_DROP");
	report("bounding set without CAP_SYS_BOOT");
	must(prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "PR_SET_KEEPCAPS");
	report("keepcaps");
	/* glibc: in every thread. Without KEEPCAPS a thread loses its permitted set here. */
	must(setresuid(65534, 65534, 65534), "setresuid");
	report("setresuid 65534");
	/* setpriv's order: its effective set raised again in this thread only. */
	uint32_t keep = BIT(CAP_SETGID) | BIT(CAP_SETUID) | BIT(CAP_SETPCAP) | BIT(CAP_NET_BIND_SERVICE);
	must(set_caps_libc(keep, keep | BIT(CAP_DAC_OVERRIDE), BIT(CAP_NET_BIND_SERVICE)), "capset");
	report("capset (libc)");
	/* Refused here, so never made in any other thread: another process's pid (were it made
	 * for the calling thread elsewhere, it would drop everything there), and a capability not
	 * in the permitted set. */
	if (set_caps_syscall(1, 0, 0, 0) == 0 || errno != EPERM) {
		fprintf(stderr, "capset for pid 1: not refused with EPERM\n");
		return 2;
	}
	if (set_caps_libc(keep | BIT(CAP_SYS_ADMIN), keep | BIT(CAP_DAC_OVERRIDE), BIT(CAP_NET_BIND_SERVICE)) == 0 ||
	    errno != EPERM) {
		fprintf(stderr, "capset raising CAP_SYS_ADMIN: not refused with EPERM\n");
		return 2;
	}
	report("two refused capsets");
	must(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_BIND_SERVICE, 0, 0), "ambient raise");
	report("ambient CAP_NET_BIND_SERVICE");
	must((int)syscall(SYS_prctl, PR_SET_SECUREBITS, SECBIT_KEEP_CAPS | SECBIT_NO_SETUID_FIXUP, 0, 0, 0),
	     "PR_SET_SECUREBITS");
	report("securebits no_setuid_fixup (syscall)");
	/* Without the fixup the effective set stays as it is; with it, euid 0 would raise it to
	 * the permitted set (CAP_DAC_OVERRIDE). */
	must(setresuid(65534, 0, 65534), "setresuid euid 0");
	report("setresuid euid 0");
	must(setresuid(65534, 65534, 65534), "setresuid back");
	report("setresuid euid 65534");
	/* util-linux setpriv aborted here under the daemon: the agent's threads had no CAP_SETGID. */
	must(setresgid(65534, 65534, 65534), "setresgid");
	must(setgroups(0, NULL), "setgroups");
	report("setresgid 65534, setgroups none");
	uint32_t nbs = BIT(CAP_NET_BIND_SERVICE);
	must(set_caps_syscall(0, nbs, nbs, nbs), "capset (syscall)");
	report("capset (syscall)");
	must((int)syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS");
	report("no_new_privs (syscall)");
	long bad = check(m, mib, 4);
	printf("dropped: %zu MiB, %ld bad words\n", mib, bad);
	fflush(stdout);
	pid_t c = fork();
	if (c == 0) {
		report("fork child");
		uint64_t *own = fill(mib, 5);
		long cbad = check(own, mib, 5) + check(m, mib, 4);
		printf("fork child: %zu MiB and %zu inherited, %ld bad words\n", mib, mib, cbad);
		fflush(stdout);
		if (failures || cbad)
			return 1;
		execl("/proc/self/exe", argv[0], "exec-check", argv[2], (char *)NULL);
		perror("exec");
		return 2;
	}
	int st;
	waitpid(c, &st, 0);
	int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	printf("parent: child exited %d\n", code);
	return failures || bad || code ? 1 : 0;
}
