/*
 * A soak of the daemon: a bystander that writes and checks a model of its memory with many
 * threads, forks and madvise/mremap calls, beside a hostile process of the same tree that
 * attacks the daemon's agent socket the whole time.
 *
 * Usage: soak MIB THREADS SECONDS
 *
 * The bystander mallocs MIB MiB and cuts it in one stripe of pages per thread. Every page
 * carries a stamp: each of its 512 words is (page index << 32 | version) ^ (word * K), or 0 for
 * version 0 (a page never written, or dropped with MADV_DONTNEED). Each thread keeps the
 * versions of its pages in a private array (the model) and checks the page at every read.
 * A thread first writes version 1 to its whole stripe (checking each page is zero first), then
 * until SECONDS have passed picks pages at random: it checks the page, and writes a new
 * version to it half of the time. Every fourth thread also drops a page with MADV_DONTNEED now
 * and then (it must read back as zeros; the model then says 0); every fourth thread also moves
 * a run of 16 pages away with mremap (MREMAP_DONTUNMAP) now and then, checks and rewrites
 * every other one there, moves them back and checks them again. At the end every page is
 * checked.
 *
 * Meanwhile the main thread forks a child every few seconds (at most two at a time), with the
 * threads held still so that the model copied at the fork is exact. The child checks every
 * page it inherited against that model, writes a copy of its own to every page and checks it,
 * reports its counts through a pipe and exits with the number of wrong pages (capped at 254;
 * 255: it could not run).
 *
 * Under uffd-daemon (UFFD_DAEMON_SOCK set) the main thread first forks the hostile process:
 * until told to stop it connects to the daemon's socket again and again and sends garbage,
 * truncated headers, oversized lengths and packets, HELLOs naming other pids (with a real
 * userfaultfd), HELLOs carrying a pipe or /dev/null or no descriptor or too many, forged
 * messages of the other kinds (a DROP naming the bystander's pages), a HELLO asking for the
 * device followed by a bad second one, and batches of connections that never greet. Every
 * attack must be refused: an answer other than ERROR or a closed connection (a HELLO_ACK to
 * a forged greeting) is counted as accepted, and the hostile process then exits 1.
 *
 * Prints the first mismatches on stderr (with how and when the model last changed the page),
 * then one line of counts for the bystander ("soak: key=value ...") and one for the hostile
 * process ("hostile: key=value ..."). Exits 0 only if no page was wrong anywhere and every
 * child and the hostile process exited 0.
 *
 * Compiled at test time by tests/soak.rs with the system's cc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define WORDS (PAGE / 8)
#define MIX 0x9E3779B97F4A7C15ull
#define RUN_PAGES 16	   /* pages one mremap moves */
#define REPORT_MAX 20	   /* mismatches described on stderr, at most */
#define MAX_CHILDREN 2	   /* alive at once */
#define CHILD_VERSION 0x80000000u /* added to the model's version in a child's own copy */
#ifndef REMAP_PER_MILLE
#define REMAP_PER_MILLE 30 /* of a remapping thread's operations (about 2000 moves a run) */
#endif
#ifndef DONTNEED_PER_MILLE
#define DONTNEED_PER_MILLE 4 /* of a dropping thread's operations */
#endif

enum check { CHECK_READ, CHECK_ZERO, CHECK_MREMAP, CHECK_FINAL, CHECK_INHERITED, CHECK_OWN, NCHECKS };
static const char *const check_name[NCHECKS] = { "read", "dontneed", "mremap", "final", "inherited", "own" };

static char *buf;
static size_t npages, stripe;
static unsigned nthreads;
static volatile int stop;
static pthread_rwlock_t still; /* workers read-lock each operation; a fork write-locks */
static int reported;	       /* mismatches described so far */

struct worker {
	pthread_t thread;
	unsigned index;
	size_t first; /* its first page */
	uint32_t *ver; /* the model: the version of each of its pages */
	uint64_t rng;
	int dontneed, remap;
	uint64_t checks, writes, dontneeds, remaps;
	uint64_t bad[NCHECKS];
};
static struct worker *workers;
static uint64_t t0;
static uint32_t *when; /* for a mismatch's report: when each page last changed (ms from the start) */
static uint8_t *how;   /* and how (a `change`) */

enum change { FILLED, WRITTEN, WRITTEN_AWAY, DROPPED };
static const char *const change_name[] = { "the fill", "a write", "a write at the mremap address",
	"MADV_DONTNEED" };

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static uint64_t stamp(size_t page, uint32_t version)
{
	return version ? ((uint64_t)page << 32 | version) : 0;
}

static void write_page(char *at, size_t page, uint32_t version)
{
	uint64_t s = stamp(page, version), *w = (uint64_t *)at;
	for (size_t i = 0; i < WORDS; i++)
		w[i] = version ? s ^ (i * MIX) : 0;
}

/* Milliseconds since the threads started. */
static uint32_t ms(void)
{
	return (uint32_t)((now_ns() - t0) / 1000000u);
}

/* Whether the page at `at` (page index `page`) carries `version`; describes the first
 * mismatches on stderr, with the model's last change of the page. */
static int check_page(const char *at, size_t page, uint32_t version, enum check what, const char *who, int id)
{
	uint64_t s = stamp(page, version);
	const uint64_t *w = (const uint64_t *)at;
	size_t wrong = 0;
	for (size_t i = 0; i < WORDS; i++)
		wrong += w[i] != (version ? s ^ (i * MIX) : 0);
	if (!wrong)
		return 1;
	if (__atomic_fetch_add(&reported, 1, __ATOMIC_RELAXED) < REPORT_MAX)
		fprintf(stderr,
			"MISMATCH %s check, %s %d: page %zu at %p should be version %u; %zu of %lu words wrong; "
			"word 0 is %#llx (page %llu version %llu); the model's last change was %s at %u ms; now %u ms\n",
			check_name[what], who, id, page, (const void *)at, version, wrong, WORDS,
			(unsigned long long)w[0], (unsigned long long)(w[0] >> 32),
			(unsigned long long)(w[0] & 0xffffffffu), change_name[how[page]], when[page], ms());
	return 0;
}

static char *page_at(size_t page)
{
	return buf + page * PAGE;
}

static uint32_t bump(uint32_t v)
{
	return v + 1 >= CHILD_VERSION ? 1 : v + 1;
}

static void check(struct worker *w, const char *at, size_t i, enum check what)
{
	w->checks++;
	if (!check_page(at, w->first + i, w->ver[i], what, "thread", (int)w->index))
		w->bad[what]++;
}

static void note(struct worker *w, size_t i, enum change change)
{
	how[w->first + i] = (uint8_t)change;
	when[w->first + i] = ms();
}

/* Moves RUN_PAGES pages from `i` away with mremap, checks them there, rewrites every other
 * one, moves them back and checks them at home. MREMAP_DONTUNMAP both ways, so that no hole
 * opens in the buffer (another thread's mmap could land in it) or at the away address: both
 * ranges stay mapped until the away one is unmapped at the end. */
static void remap_run(struct worker *w, size_t i)
{
	size_t len = RUN_PAGES * PAGE;
	int flags = MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP;
	char *home = page_at(w->first + i);
	char *away = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (away == MAP_FAILED) {
		perror("soak: mmap for mremap");
		exit(3);
	}
	if (mremap(home, len, len, flags, away) != away) {
		perror("soak: mremap away");
		exit(3);
	}
	for (size_t k = 0; k < RUN_PAGES; k++) {
		check(w, away + k * PAGE, i + k, CHECK_MREMAP);
		if (k % 2 == 0) {
			w->ver[i + k] = bump(w->ver[i + k]);
			write_page(away + k * PAGE, w->first + i + k, w->ver[i + k]);
			note(w, i + k, WRITTEN_AWAY);
			w->writes++;
		}
	}
	if (mremap(away, len, len, flags, home) != home) {
		perror("soak: mremap home");
		exit(3);
	}
	if (munmap(away, len) != 0) {
		perror("soak: munmap");
		exit(3);
	}
	for (size_t k = 0; k < RUN_PAGES; k++)
		check(w, home + k * PAGE, i + k, CHECK_MREMAP);
	w->remaps++;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	/* Fill: every page is zero, then version 1. */
	for (size_t i = 0; i < stripe; i++) {
		pthread_rwlock_rdlock(&still);
		check(w, page_at(w->first + i), i, CHECK_READ);
		w->ver[i] = 1;
		write_page(page_at(w->first + i), w->first + i, 1);
		note(w, i, FILLED);
		w->writes++;
		pthread_rwlock_unlock(&still);
	}
	while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		pthread_rwlock_rdlock(&still);
		uint64_t r = next(&w->rng);
		size_t i = (size_t)(r >> 16) % stripe;
		char *at = page_at(w->first + i);
		unsigned dice = (unsigned)(r % 1000);
		check(w, at, i, CHECK_READ);
		if (w->dontneed && dice < DONTNEED_PER_MILLE) {
			if (madvise(at, PAGE, MADV_DONTNEED) != 0) {
				perror("soak: madvise");
				exit(3);
			}
			w->ver[i] = 0;
			note(w, i, DROPPED);
			check(w, at, i, CHECK_ZERO);
			w->dontneeds++;
		} else if (w->remap && dice >= 1000 - REMAP_PER_MILLE) {
			remap_run(w, i / RUN_PAGES * RUN_PAGES);
		} else if (dice < 500) {
			w->ver[i] = bump(w->ver[i]);
			write_page(at, w->first + i, w->ver[i]);
			note(w, i, WRITTEN);
			w->writes++;
		}
		pthread_rwlock_unlock(&still);
	}
	for (size_t i = 0; i < stripe; i++)
		check(w, page_at(w->first + i), i, CHECK_FINAL);
	return NULL;
}

/* What one child reports through the pipe. */
struct child_report {
	int pid;
	uint32_t pages;
	uint32_t bad_inherited, bad_own;
};

/* In a fork child: checks the inherited pages against the model, writes its own copy and
 * checks it. */
static void child(int report_fd)
{
	struct child_report rep = { .pid = getpid(), .pages = (uint32_t)npages };
	for (unsigned t = 0; t < nthreads; t++)
		for (size_t i = 0; i < stripe; i++)
			if (!check_page(page_at(workers[t].first + i), workers[t].first + i, workers[t].ver[i],
					CHECK_INHERITED, "child", rep.pid))
				rep.bad_inherited++;
	for (unsigned t = 0; t < nthreads; t++)
		for (size_t i = 0; i < stripe; i++)
			write_page(page_at(workers[t].first + i), workers[t].first + i,
				   workers[t].ver[i] + CHILD_VERSION);
	for (unsigned t = 0; t < nthreads; t++)
		for (size_t i = 0; i < stripe; i++)
			if (!check_page(page_at(workers[t].first + i), workers[t].first + i,
					workers[t].ver[i] + CHILD_VERSION, CHECK_OWN, "child", rep.pid))
				rep.bad_own++;
	if (write(report_fd, &rep, sizeof rep) != (ssize_t)sizeof rep)
		_exit(255);
	uint32_t bad = rep.bad_inherited + rep.bad_own;
	_exit(bad > 254 ? 254 : (int)bad);
}

/* ---- The hostile process ---------------------------------------------------------------- */

#define MAGIC 0x41444655u
#define HEADER_LEN 16
#define KIND_HELLO 1
#define KIND_HELLO_ACK 2
#define KIND_DROP 3
#define KIND_DROP_DONE 4
#define KIND_ERROR 5
#define HELLO_FORK_CHILD 1u
#define HELLO_NEED_UFFD 2u
#define SILENT 40	   /* connections of one batch that never greet */
#define ATTACK_PAUSE_MS 10

enum attack {
	A_GARBAGE,
	A_TRUNCATED,
	A_LENGTH,	/* a header claiming a huge payload */
	A_OVERSIZED,	/* a packet larger than the daemon's maximum */
	A_OTHER_PID,	/* HELLO naming another pid, with a real userfaultfd */
	A_PIPE,
	A_DEVNULL,
	A_NO_FD,
	A_MANY_FDS,
	A_FORGED,	/* HELLO_ACK, DROP (naming the bystander's pages), DROP_DONE, ERROR, kind 77,
			 * version 2, a HELLO with unknown flags or a bad region */
	A_NEED_UFFD,	/* HELLO asking for the device, then a second HELLO with a pipe */
	NATTACKS
};
static const char *const attack_name[NATTACKS] = { "garbage", "truncated", "length", "oversized",
	"other_pid", "pipe", "devnull", "no_fd", "many_fds", "forged", "need_uffd" };

static struct sockaddr_un daemon_addr;
static uint64_t attacks[NATTACKS];
static uint64_t refused, closed, accepted, unanswered, lent, send_failed, silent_batches;

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void header(uint8_t *p, uint16_t version, uint16_t kind, uint32_t len)
{
	put32(p, MAGIC);
	memcpy(p + 4, &version, 2);
	memcpy(p + 6, &kind, 2);
	put32(p + 8, len);
	put32(p + 12, 1);
}

/* A HELLO of the agent's shape: an aligned region holding the probe and 16 scratch pages. */
static size_t hello(uint8_t *p, uint32_t pid, uint32_t flags, uint64_t region)
{
	memset(p, 0, HEADER_LEN + 64);
	header(p, 1, KIND_HELLO, 64);
	uint8_t *q = p + HEADER_LEN;
	put32(q, pid);
	put32(q + 4, (uint32_t)getppid());
	put32(q + 8, flags);
	put64(q + 16, 0xffffffffull);
	put64(q + 24, region);
	put64(q + 32, 32 * PAGE);
	put64(q + 40, region);
	put64(q + 48, region + PAGE);
	put32(q + 56, 16);
	return HEADER_LEN + 64;
}

static int connect_daemon(int nonblock)
{
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
	if (s < 0)
		return -1;
	if (connect(s, (struct sockaddr *)&daemon_addr, sizeof daemon_addr) < 0 && errno != EINPROGRESS &&
	    errno != EAGAIN) {
		close(s);
		return -1;
	}
	struct timeval tv = { .tv_sec = 20 };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return s;
}

static int send_fds(int s, const void *data, size_t len, const int *fds, int nfds)
{
	struct iovec iov = { (void *)data, len };
	union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int) * 32)]; } c;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		memset(&c, 0, sizeof c);
		m.msg_control = c.b;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *h = CMSG_FIRSTHDR(&m);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(h), fds, sizeof(int) * nfds);
	}
	return sendmsg(s, &m, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

/* Reads the daemon's answer: its kind (ERROR expected), 0 for a closed connection, -1 for
 * none in time; a descriptor that comes with it is closed. */
static int answer(int s)
{
	uint8_t in[4096];
	union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int) * 4)]; } c;
	struct iovec iov = { in, sizeof in };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.b, .msg_controllen = sizeof c.b };
	ssize_t n;
	do
		n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	for (struct cmsghdr *h = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h))
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
			for (size_t k = 0; k < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
				int fd;
				memcpy(&fd, CMSG_DATA(h) + k * sizeof(int), sizeof fd);
				close(fd);
			}
	if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
		return 0;
	if (n < 0)
		return -1;
	if (n < HEADER_LEN)
		return 1000;
	uint16_t kind;
	memcpy(&kind, in + 6, 2);
	return kind;
}

static void tally(enum attack a, int kind)
{
	if (kind == KIND_ERROR)
		refused++;
	else if (kind == 0)
		closed++;
	else if (kind < 0)
		unanswered++;
	else {
		accepted++;
		fprintf(stderr, "hostile: ACCEPTED: the daemon answered a %s attack with kind %d\n",
			attack_name[a], kind);
	}
}

static void attack(enum attack a, uint64_t *rng, uint64_t region)
{
	uint8_t pkt[HEADER_LEN + 1024];
	static uint8_t big[100 * 1024];
	int s = connect_daemon(0);
	if (s < 0) {
		send_failed++;
		return;
	}
	attacks[a]++;
	size_t len;
	int fds[20], nfds = 0, rc = 0;
	uint32_t me = (uint32_t)getpid();
	int p[2] = { -1, -1 };
	uint64_t r = next(rng);
	switch (a) {
	case A_GARBAGE:
		len = 1 + r % 1000;
		for (size_t i = 0; i < len; i++)
			pkt[i] = (uint8_t)next(rng);
		pkt[0] ^= 0x80; /* never the magic */
		rc = send_fds(s, pkt, len, NULL, 0);
		break;
	case A_TRUNCATED:
		hello(pkt, me, 0, region);
		rc = send_fds(s, pkt, 1 + r % (HEADER_LEN - 1), NULL, 0);
		break;
	case A_LENGTH: {
		static const uint32_t lens[] = { 0xffffffffu, 0x80000000u, 1u << 20, 64 * 1024 + 1, 65 };
		len = hello(pkt, me, 0, region);
		put32(pkt + 8, lens[r % 5]);
		rc = send_fds(s, pkt, len, NULL, 0);
		break;
	}
	case A_OVERSIZED:
		hello(big, me, 0, region);
		put32(big + 8, sizeof big - HEADER_LEN);
		rc = send_fds(s, big, sizeof big, NULL, 0);
		break;
	case A_OTHER_PID: {
		static const uint32_t other[] = { 1, 0, 0xffffffffu };
		uint32_t pid = r % 4 == 0 ? (uint32_t)getppid() :
			       r % 4 == 1 ? (uint32_t)strtoul(getenv("UFFD_DAEMON_PID"), NULL, 10) :
			       other[(r >> 8) % 3];
		uint32_t flags = (r >> 16) % 2 ? HELLO_FORK_CHILD : 0;
		/* The bystander's own buffer as the agent region. */
		len = hello(pkt, pid, flags, pid == (uint32_t)getppid() ? (uint64_t)(uintptr_t)buf : region);
		int u = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		if (u >= 0)
			fds[nfds++] = u;
		rc = send_fds(s, pkt, len, fds, nfds);
		break;
	}
	case A_PIPE:
		if (pipe2(p, O_CLOEXEC) == 0) {
			/* A forged fork event (uffd_msg: event 0x13, descriptor 3) waiting in it. */
			uint8_t ev[32] = { 0x13 };
			put32(ev + 8, 3);
			if (write(p[1], ev, sizeof ev) < 0)
				perror("hostile: write");
			fds[nfds++] = p[0];
		}
		len = hello(pkt, me, 0, region);
		rc = send_fds(s, pkt, len, fds, nfds);
		break;
	case A_DEVNULL:
		fds[0] = open("/dev/null", O_RDWR | O_CLOEXEC);
		nfds = fds[0] >= 0;
		len = hello(pkt, me, 0, region);
		rc = send_fds(s, pkt, len, fds, nfds);
		break;
	case A_NO_FD:
		len = hello(pkt, me, 0, region);
		rc = send_fds(s, pkt, len, NULL, 0);
		break;
	case A_MANY_FDS:
		for (nfds = 0; nfds < 20; nfds++)
			fds[nfds] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		len = hello(pkt, me, 0, region);
		rc = send_fds(s, pkt, len, fds, nfds);
		break;
	case A_FORGED:
		switch (r % 8) {
		case 0:
			header(pkt, 1, KIND_HELLO_ACK, 8);
			put32(pkt + HEADER_LEN, 0);
			put32(pkt + HEADER_LEN + 4, 4096);
			len = HEADER_LEN + 8;
			break;
		case 1: /* a DROP naming the bystander's first pages */
			header(pkt, 1, KIND_DROP, 8 + 16);
			put32(pkt + HEADER_LEN, 1);
			put32(pkt + HEADER_LEN + 4, 0);
			put64(pkt + HEADER_LEN + 8, (uint64_t)(uintptr_t)buf);
			put32(pkt + HEADER_LEN + 16, 16);
			put32(pkt + HEADER_LEN + 20, 0);
			len = HEADER_LEN + 8 + 16;
			break;
		case 2:
			header(pkt, 1, KIND_DROP_DONE, 8 + 4);
			put32(pkt + HEADER_LEN, 4);
			put32(pkt + HEADER_LEN + 4, 0);
			memset(pkt + HEADER_LEN + 8, 0, 4);
			len = HEADER_LEN + 12;
			break;
		case 3:
			header(pkt, 1, KIND_ERROR, 4 + 5);
			put32(pkt + HEADER_LEN, 1);
			memcpy(pkt + HEADER_LEN + 4, "forge", 5);
			len = HEADER_LEN + 9;
			break;
		case 4:
			len = hello(pkt, me, 0, region);
			pkt[6] = 77;
			break;
		case 5:
			len = hello(pkt, me, 0, region);
			pkt[4] = 2;
			break;
		case 6:
			len = hello(pkt, me, 0x100, region);
			break;
		default: /* the scratch outside the region */
			len = hello(pkt, me, 0, region);
			put64(pkt + HEADER_LEN + 32, PAGE);
			break;
		}
		fds[0] = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		nfds = fds[0] >= 0;
		rc = send_fds(s, pkt, len, fds, nfds);
		break;
	case A_NEED_UFFD: {
		len = hello(pkt, me, HELLO_NEED_UFFD, region);
		if (send_fds(s, pkt, len, NULL, 0) < 0) {
			rc = -1;
			break;
		}
		int k = answer(s);
		if (k != KIND_HELLO_ACK) {
			tally(a, k); /* refused at once: as good */
			goto out;
		}
		lent++;
		/* A second HELLO with a pipe, or asking again. */
		if (pipe2(p, O_CLOEXEC) == 0)
			fds[nfds++] = p[0];
		len = hello(pkt, me, r % 2 ? HELLO_NEED_UFFD : 0, region);
		rc = send_fds(s, pkt, len, fds, nfds);
		break;
	}
	default:
		break;
	}
	if (rc < 0 && errno != EPIPE && errno != ECONNRESET)
		send_failed++;
	tally(a, answer(s));
out:
	for (int k = 0; k < nfds; k++)
		close(fds[k]);
	if (p[1] >= 0)
		close(p[1]);
	close(s);
}

/* The hostile process: attacks until `stop_fd` reads end of file. */
static void hostile(int stop_fd)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
	char *region = mmap(NULL, 32 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED)
		_exit(3);
	int silent[SILENT], nsilent = 0;
	uint64_t silent_since = 0, start = now_ns();
	for (uint64_t i = 0;; i++) {
		struct pollfd pf = { .fd = stop_fd, .events = POLLIN };
		if (poll(&pf, 1, 0) > 0)
			break;
		attack((enum attack)(i % NATTACKS), &rng, (uint64_t)(uintptr_t)region);
		/* Every 6 s, a batch of connections that never greet, held 3 s. */
		uint64_t t = now_ns() - start;
		if (nsilent == 0 && t / 6000000000u >= silent_batches + 1) {
			for (nsilent = 0; nsilent < SILENT; nsilent++)
				if ((silent[nsilent] = connect_daemon(1)) < 0)
					break;
			silent_batches++;
			silent_since = t;
		} else if (nsilent > 0 && t - silent_since > 3000000000u) {
			while (nsilent > 0)
				close(silent[--nsilent]);
		}
		usleep(ATTACK_PAUSE_MS * 1000);
	}
	while (nsilent > 0)
		close(silent[--nsilent]);
	uint64_t total = 0;
	for (int a = 0; a < NATTACKS; a++)
		total += attacks[a];
	printf("hostile: attacks=%llu", (unsigned long long)total);
	for (int a = 0; a < NATTACKS; a++)
		printf(" %s=%llu", attack_name[a], (unsigned long long)attacks[a]);
	printf(" silent_batches=%llu silent_each=%d refused=%llu closed=%llu lent_device=%llu unanswered=%llu "
	       "connect_or_send_failed=%llu accepted=%llu\n",
	       (unsigned long long)silent_batches, SILENT, (unsigned long long)refused,
	       (unsigned long long)closed, (unsigned long long)lent, (unsigned long long)unanswered,
	       (unsigned long long)send_failed, (unsigned long long)accepted);
	fflush(stdout);
	_exit(accepted ? 1 : 0);
}

/* ---- The main thread ---------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: soak MIB THREADS SECONDS\n");
		return 2;
	}
	size_t mib = strtoul(argv[1], NULL, 10);
	nthreads = (unsigned)strtoul(argv[2], NULL, 10);
	unsigned seconds = (unsigned)strtoul(argv[3], NULL, 10);
	if (nthreads == 0 || mib == 0)
		return 2;
	stripe = (mib << 8) / nthreads / RUN_PAGES * RUN_PAGES;
	npages = stripe * nthreads;
	if (stripe < RUN_PAGES) {
		fprintf(stderr, "soak: %zu MiB is too small for %u threads\n", mib, nthreads);
		return 2;
	}
	char *raw = malloc((npages + 1) * PAGE);
	workers = calloc(nthreads, sizeof *workers);
	when = calloc(npages, sizeof *when);
	how = calloc(npages, sizeof *how);
	if (!raw || !workers || !when || !how) {
		perror("soak: malloc");
		return 3;
	}
	buf = (char *)(((uintptr_t)raw + PAGE - 1) & ~(PAGE - 1));

	/* The hostile process, under the daemon only. */
	const char *sock = getenv("UFFD_DAEMON_SOCK");
	int stop_pipe[2] = { -1, -1 };
	pid_t enemy = -1;
	if (sock && getenv("UFFD_DAEMON_PID")) {
		daemon_addr.sun_family = AF_UNIX;
		strncpy(daemon_addr.sun_path, sock, sizeof daemon_addr.sun_path - 1);
		if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
			perror("soak: pipe");
			return 3;
		}
		fflush(stdout);
		enemy = fork();
		if (enemy == 0) {
			close(stop_pipe[1]);
			hostile(stop_pipe[0]);
		}
		close(stop_pipe[0]);
	} else {
		printf("hostile: not started (no UFFD_DAEMON_SOCK: not under uffd-daemon)\n");
	}

	int reports[2];
	if (pipe2(reports, O_CLOEXEC | O_NONBLOCK) != 0) {
		perror("soak: pipe");
		return 3;
	}
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&still, &ra);
	for (unsigned t = 0; t < nthreads; t++) {
		struct worker *w = &workers[t];
		w->index = t;
		w->first = (size_t)t * stripe;
		w->ver = calloc(stripe, sizeof *w->ver);
		w->rng = 0x2545F4914F6CDD1Dull * (t + 1);
		w->dontneed = t % 4 == 1;
		w->remap = t % 4 == 3;
		if (!w->ver) {
			perror("soak: malloc");
			return 3;
		}
	}
	uint64_t start = now_ns();
	t0 = start;
	for (unsigned t = 0; t < nthreads; t++)
		if (pthread_create(&workers[t].thread, NULL, work, &workers[t]) != 0) {
			perror("soak: pthread_create");
			return 3;
		}

	/* Fork a child every few seconds while the threads run. */
	uint64_t end = start + (uint64_t)seconds * 1000000000u;
	uint64_t every = (uint64_t)seconds * 1000000000u / 8;
	uint64_t children = 0, children_failed = 0, child_status_bad = 0;
	int alive = 0;
	for (uint64_t next_fork = start + every; now_ns() < end;) {
		usleep(50000);
		int st;
		pid_t pid;
		while ((pid = waitpid(-1, &st, WNOHANG)) > 0 && pid != enemy) {
			alive--;
			if (!WIFEXITED(st) || WEXITSTATUS(st) == 255) {
				children_failed++;
				fprintf(stderr, "soak: child %d ended with status %#x\n", (int)pid, st);
			} else {
				child_status_bad += WEXITSTATUS(st);
			}
		}
		if (pid == enemy && enemy > 0) {
			fprintf(stderr, "soak: the hostile process ended early (status %#x)\n", st);
			enemy = -2;
		}
		if (now_ns() < next_fork || alive >= MAX_CHILDREN)
			continue;
		pthread_rwlock_wrlock(&still);
		fflush(stdout);
		fflush(stderr);
		pid = fork();
		if (pid == 0)
			child(reports[1]);
		pthread_rwlock_unlock(&still);
		if (pid < 0) {
			perror("soak: fork");
			children_failed++;
		} else {
			children++;
			alive++;
			fprintf(stderr, "soak: child %d forked at %u ms\n", (int)pid, ms());
		}
		next_fork = now_ns() + every;
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (unsigned t = 0; t < nthreads; t++)
		pthread_join(workers[t].thread, NULL);
	while (alive > 0) {
		int st;
		pid_t pid = waitpid(-1, &st, 0);
		if (pid < 0)
			break;
		if (pid == enemy) {
			fprintf(stderr, "soak: the hostile process ended early (status %#x)\n", st);
			enemy = -2;
			continue;
		}
		alive--;
		if (!WIFEXITED(st) || WEXITSTATUS(st) == 255) {
			children_failed++;
			fprintf(stderr, "soak: child %d ended with status %#x\n", (int)pid, st);
		} else {
			child_status_bad += WEXITSTATUS(st);
		}
	}
	uint64_t child_pages = 0, child_bad[NCHECKS] = { 0 }, child_reports = 0;
	struct child_report rep;
	while (read(reports[0], &rep, sizeof rep) == (ssize_t)sizeof rep) {
		child_reports++;
		child_pages += rep.pages;
		child_bad[CHECK_INHERITED] += rep.bad_inherited;
		child_bad[CHECK_OWN] += rep.bad_own;
	}
	/* A child whose status says wrong pages but whose report is lost still counts. */
	if (child_status_bad > child_bad[CHECK_INHERITED] + child_bad[CHECK_OWN])
		child_bad[CHECK_OWN] += child_status_bad - child_bad[CHECK_INHERITED] - child_bad[CHECK_OWN];
	if (child_reports + children_failed < children)
		children_failed += children - child_reports - children_failed;

	/* Stop the hostile process and collect its verdict. */
	int enemy_status = 0;
	if (enemy > 0) {
		close(stop_pipe[1]);
		if (waitpid(enemy, &enemy_status, 0) != enemy)
			enemy_status = -1;
	} else if (enemy == -2) {
		enemy_status = -1;
	}

	int hostile_status = enemy_status < 0		 ? -1 :
			     WIFEXITED(enemy_status) ? WEXITSTATUS(enemy_status) :
						       128 + WTERMSIG(enemy_status);
	uint64_t checks = 0, writes = 0, dontneeds = 0, remaps = 0, bad[NCHECKS] = { 0 }, mismatches = 0;
	for (unsigned t = 0; t < nthreads; t++) {
		checks += workers[t].checks;
		writes += workers[t].writes;
		dontneeds += workers[t].dontneeds;
		remaps += workers[t].remaps;
		for (int c = 0; c < NCHECKS; c++)
			bad[c] += workers[t].bad[c];
	}
	bad[CHECK_INHERITED] = child_bad[CHECK_INHERITED];
	bad[CHECK_OWN] = child_bad[CHECK_OWN];
	for (int c = 0; c < NCHECKS; c++)
		mismatches += bad[c];
	printf("soak: pages=%zu threads=%u seconds=%.1f checks=%llu mismatches=%llu", npages, nthreads,
	       (double)(now_ns() - start) / 1e9, (unsigned long long)checks, (unsigned long long)mismatches);
	for (int c = 0; c < NCHECKS; c++)
		printf(" bad_%s=%llu", check_name[c], (unsigned long long)bad[c]);
	printf(" writes=%llu dontneeds=%llu mremaps=%llu children=%llu child_pages_checked=%llu "
	       "children_failed=%llu hostile_status=%d\n",
	       (unsigned long long)writes, (unsigned long long)dontneeds, (unsigned long long)remaps,
	       (unsigned long long)children, (unsigned long long)child_pages * 2,
	       (unsigned long long)children_failed, hostile_status);
	fflush(stdout);
	return mismatches || children_failed || enemy_status != 0 ? 1 : 0;
}
