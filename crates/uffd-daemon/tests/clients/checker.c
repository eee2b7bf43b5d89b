/*
 * checker: a client that makes the daemon's hard cases happen and checks every byte (the
 * `uffd-checker` binary of the daemon's crate until issue #18, rewritten in C so that test
 * scaffolding no longer builds into the production crate; same steps, lines and statuses).
 *
 *   checker [all]   every step below, in order
 *   checker hold    fills memory, prints `READY <pid>` and verifies it in a loop forever
 *                   (`round N: B bad pages` after each pass; for the daemon-killed tests)
 *
 * Run under the daemon with a limit well below its footprint so that pages are evicted between
 * steps: `uffd-daemon run --limit 8M -- checker all`. Steps: kernel-mode faults (read(2)/write(2)
 * on evicted pages), fork (the child sees its copy-on-write snapshot while the parent writes),
 * mremap (a move, a grow that must move, a grow in place), munmap + a new mapping at the same
 * address, MADV_DONTNEED, and writes and drops of pages next to readahead runs. Every page is
 * compared against a model after every step: each step prints `checker: OK STEP (RssAnon N
 * KiB)` or `checker: FAIL STEP: B bad pages`, with `MISMATCH ...` lines naming the first three
 * wrong pages of a comparison, and the run ends with `checker: ALL OK` or `checker: N failures`.
 *
 * Exit status: 0 only when every page matched; 1 on a bad page (hold: at its first bad pass);
 * 2 for an unknown mode; 101 when a system call fails or output cannot be written (the status
 * of the Rust checker's panics; a message on stderr says which).
 *
 * The page contents are those of `uffd_daemon::demo::fill_page` (src/demo.rs): 64-byte records
 * of eight little-endian words, [x, index, generation, record, 0x00007f3a9c000000 | record << 4,
 * "object-1", 0, 0xffffffff00000000], x a xorshift stream seeded by (index, generation).
 *
 * Compiled at test time by tests/common (`checker()`) with the system's cc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE ((size_t)4096)
#define MIB ((size_t)1 << 20)
#define RECORD ((size_t)64)
#define EXIT_INTERNAL 101

/* What a page should hold: the pattern of (tag, generation), zeros, or nothing to check (the
 * page was moved away and is no longer mapped). */
enum want_kind { WANT_ZERO, WANT_PATTERN, WANT_UNMAPPED };

struct want {
	enum want_kind kind;
	uint64_t tag, gen;
};

struct region {
	unsigned char *base;
	size_t pages;
	struct want *want;
	const char *name;
};

/* Set in the forked child: its errors end it with _exit, not exit. */
static int in_child;

__attribute__((noreturn)) static void quit(int status)
{
	if (in_child)
		_exit(status);
	exit(status);
}

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	va_list ap;
	(void)fflush(stdout);
	fputs("uffd-checker: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	quit(EXIT_INTERNAL);
}

/* A failed system call: what, and errno's message. */
__attribute__((noreturn)) static void fail_sys(const char *what)
{
	int err = errno;
	fail("%s: %s", what, strerror(err));
}

/* One line on stdout, flushed at once (the tests read it through a pipe while the checker runs,
 * and nothing is left buffered across the fork). */
__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vprintf(fmt, ap);
	va_end(ap);
	if (n < 0 || fflush(stdout) != 0)
		fail_sys("writing to stdout");
}

static void put_le64(unsigned char *p, uint64_t v)
{
	for (size_t b = 0; b < 8; b++)
		p[b] = (unsigned char)(v >> (8 * b));
}

/* uffd_daemon::demo::fill_page for a whole page. */
static void fill_page(unsigned char *page, uint64_t index, uint64_t gen)
{
	uint64_t x = (index * 0x9E3779B97F4A7C15ull) ^ (gen * 0xD1B54A32D192ED03ull) ^ 0x2545F4914F6CDD1Dull;
	for (size_t r = 0; r < PAGE / RECORD; r++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		const uint64_t words[RECORD / 8] = {
			x,
			index,
			gen,
			(uint64_t)r,
			0x00007f3a9c000000ull | ((uint64_t)r << 4),
			0x6f626a6563742d31ull, /* "object-1" */
			0,
			0xffffffff00000000ull,
		};
		for (size_t w = 0; w < RECORD / 8; w++)
			put_le64(page + r * RECORD + w * 8, words[w]);
	}
}

/* uffd_daemon::demo::check_page: whether the page holds what fill_page wrote. */
static int check_page(const unsigned char *page, uint64_t index, uint64_t gen)
{
	unsigned char want[PAGE];
	fill_page(want, index, gen);
	return memcmp(page, want, PAGE) == 0;
}

static int zero_page(const unsigned char *page)
{
	static const unsigned char zeros[PAGE];
	return memcmp(page, zeros, PAGE) == 0;
}

/*
 * A fresh private anonymous read-write mapping, made by the raw system call as the Rust checker
 * made its regions (uffd_daemon::sys::map_anonymous, rustix's raw-syscall backend): the agent's
 * mmap() wrapper does not see it, and the daemon registers the range from its own scan. The
 * steps' other calls (mremap, munmap, the MAP_FIXED mmap, madvise) go through libc, as there.
 */
static unsigned char *map_anonymous(size_t bytes)
{
	long r = syscall(SYS_mmap, 0L, (long)bytes, (long)(PROT_READ | PROT_WRITE),
			 (long)(MAP_PRIVATE | MAP_ANONYMOUS), -1L, 0L);
	if (r == -1)
		fail_sys("mmap failed");
	return (unsigned char *)(uintptr_t)r;
}

/* The model of n pages (entries to be set by the caller). */
static struct want *new_wants(size_t n)
{
	struct want *w = n <= SIZE_MAX / sizeof *w ? malloc(n * sizeof *w) : NULL;
	if (!w)
		fail("out of memory for %zu pages' model", n);
	return w;
}

/* `old` resized to n pages, its first entries kept (the new ones to be set by the caller). */
static struct want *grow_wants(struct want *old, size_t n)
{
	struct want *w = n <= SIZE_MAX / sizeof *w ? realloc(old, n * sizeof *w) : NULL;
	if (!w)
		fail("out of memory for %zu pages' model", n);
	return w;
}

static struct region region_new(const char *name, size_t bytes)
{
	struct region r = { .base = map_anonymous(bytes), .pages = bytes / PAGE, .name = name };
	r.want = new_wants(r.pages);
	for (size_t i = 0; i < r.pages; i++)
		r.want[i] = (struct want){ .kind = WANT_ZERO };
	return r;
}

static unsigned char *page_at(const struct region *r, size_t i)
{
	if (i >= r->pages)
		fail("page %zu out of region %s (%zu pages)", i, r->name, r->pages);
	return r->base + i * PAGE;
}

static void region_write(struct region *r, size_t i, uint64_t tag, uint64_t gen)
{
	fill_page(page_at(r, i), tag, gen);
	r->want[i] = (struct want){ .kind = WANT_PATTERN, .tag = tag, .gen = gen };
}

/* Compares every page with the model; pages moved away (unmapped) are skipped. Names the first
 * three wrong pages; returns how many were wrong. */
static size_t verify(const struct region *r, const char *step)
{
	size_t bad = 0;
	for (size_t i = 0; i < r->pages; i++) {
		const struct want *w = &r->want[i];
		int ok;
		switch (w->kind) {
		case WANT_PATTERN:
			ok = check_page(page_at(r, i), w->tag, w->gen);
			break;
		case WANT_ZERO:
			ok = zero_page(page_at(r, i));
			break;
		case WANT_UNMAPPED:
		default:
			ok = 1;
			break;
		}
		if (ok)
			continue;
		bad++;
		if (bad > 3)
			continue;
		if (w->kind == WANT_PATTERN)
			say("MISMATCH %s: region %s page %zu: want Pattern(%" PRIu64 ", %" PRIu64 ")\n", step,
			    r->name, i, w->tag, w->gen);
		else
			say("MISMATCH %s: region %s page %zu: want Zero\n", step, r->name, i);
	}
	return bad;
}

/* RssAnon of /proc/self/status in KiB; 0 if it cannot be read. */
static uint64_t rss_anon_kib(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return 0;
	uint64_t kib = 0;
	char *line = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) != -1) {
		if (strncmp(line, "RssAnon:", 8) != 0)
			continue;
		const char *p = line + 8;
		while (*p == ' ' || *p == '\t')
			p++;
		uint64_t v = 0;
		int digits = 0;
		for (; *p >= '0' && *p <= '9'; p++, digits++) {
			unsigned d = (unsigned)(*p - '0');
			if (v > (UINT64_MAX - d) / 10) {
				digits = 0;
				break;
			}
			v = v * 10 + d;
		}
		if (digits > 0 && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\0'))
			kib = v;
		break;
	}
	free(line);
	(void)fclose(f); /* read only: nothing to lose */
	return kib;
}

/* Writes the scratch region so that the daemon has to evict older pages. */
static void pressure(struct region *scratch, uint64_t round)
{
	for (size_t i = 0; i < scratch->pages; i++)
		region_write(scratch, i, 1000000 + (uint64_t)i, round);
}

/* The regions the steps work on, and the failures so far. */
struct checker {
	struct region a, scratch;
	size_t failures;
};

static void report(struct checker *c, const char *step, size_t bad)
{
	if (bad == 0) {
		uint64_t rss = rss_anon_kib();
		say("checker: OK %s (RssAnon %" PRIu64 " KiB)\n", step, rss);
	} else {
		say("checker: FAIL %s: %zu bad pages\n", step, bad);
		c->failures += bad;
	}
}

static ssize_t write_or_fail(int fd, const void *buf, size_t len, const char *what)
{
	ssize_t n;
	do
		n = write(fd, buf, len);
	while (n == -1 && errno == EINTR);
	if (n == -1)
		fail_sys(what);
	return n;
}

static ssize_t read_or_fail(int fd, void *buf, size_t len, const char *what)
{
	ssize_t n;
	do
		n = read(fd, buf, len);
	while (n == -1 && errno == EINTR);
	if (n == -1)
		fail_sys(what);
	return n;
}

static void close_or_fail(int fd)
{
	if (close(fd) != 0)
		fail_sys("close");
}

/* A (32 MiB) filled, then pushed out by the scratch region. */
static void step_fill(struct checker *c)
{
	c->a = region_new("A", 32 * MIB);
	c->scratch = region_new("scratch", 16 * MIB);
	c->failures = 0;
	for (size_t i = 0; i < c->a.pages; i++)
		region_write(&c->a, i, (uint64_t)i, 0);
	pressure(&c->scratch, 0);
	report(c, "fill", verify(&c->a, "fill"));
}

/* Step 1: kernel-mode faults: write(2) reads an evicted page, read(2) writes into one. */
static void step_kernel_mode_faults(struct checker *c)
{
	struct region *a = &c->a;
	pressure(&c->scratch, 1);
	int fds[2];
	if (pipe(fds) != 0)
		fail_sys("pipe");
	/* The pipe holds one page, and a write of PIPE_BUF bytes is atomic. */
	if (write_or_fail(fds[1], page_at(a, 3), PAGE, "write(2) from page 3") != (ssize_t)PAGE)
		fail("write(2) from page 3 was short");
	if (read_or_fail(fds[0], page_at(a, 5), PAGE, "read(2) into page 5") != (ssize_t)PAGE)
		fail("read(2) into page 5 was short");
	close_or_fail(fds[0]);
	close_or_fail(fds[1]);
	a->want[5] = a->want[3];
	size_t bad = verify(a, "kernel-mode faults");
	report(c, "kernel-mode faults", bad);
}

/* Step 2: fork: the child must see the snapshot taken at fork, whatever the parent does next. */
static void step_fork(struct checker *c)
{
	pressure(&c->scratch, 2);
	struct region *a = &c->a;
	struct want *snapshot = new_wants(a->pages);
	memcpy(snapshot, a->want, a->pages * sizeof *snapshot);
	int go[2];
	if (pipe(go) != 0)
		fail_sys("pipe");
	if (fflush(stdout) != 0) /* nothing buffered to be written twice */
		fail_sys("writing to stdout");
	pid_t pid = fork();
	if (pid == -1)
		fail_sys("fork failed");
	if (pid == 0) {
		in_child = 1;
		close_or_fail(go[1]);
		unsigned char b;
		/* Wait for the parent to finish writing. */
		if (read_or_fail(go[0], &b, 1, "reading the parent's go") != 1)
			fail("the parent closed the pipe without its go");
		free(a->want);
		a->want = snapshot;
		size_t bad = verify(a, "fork child (snapshot)");
		for (size_t i = 0; i < a->pages; i += 2)
			region_write(a, i, (uint64_t)i, 7);
		pressure(&c->scratch, 9);
		bad += verify(a, "fork child (own writes)");
		_exit(bad == 0 ? 0 : 1);
	}
	free(snapshot);
	close_or_fail(go[0]);
	for (size_t i = 0; i < a->pages / 2; i++)
		region_write(a, i, (uint64_t)i, 3); /* the parent writes after the fork, before the child reads */
	if (write_or_fail(go[1], "g", 1, "writing the child's go") != 1)
		fail("writing the child's go was short");
	close_or_fail(go[1]);
	int status;
	pid_t w;
	do
		w = waitpid(pid, &status, 0);
	while (w == -1 && errno == EINTR);
	if (w == -1)
		fail_sys("waitpid");
	if (w != pid)
		fail("waitpid returned %ld, not the child %ld", (long)w, (long)pid);
	int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	report(c, "fork (child saw its snapshot and its own writes)", child_ok ? 0 : 1);
	pressure(&c->scratch, 3);
	size_t bad = verify(&c->a, "fork parent");
	report(c, "fork (parent kept its own writes)", bad);
}

/* A page with no access right after `end`, so that a mapping ending there cannot grow in place;
 * 0 when something is mapped there already (it cannot grow in place either). */
static void *guard_after(unsigned char *end)
{
	void *p = mmap(end, PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED) {
		if (errno == EEXIST)
			return 0;
		fail_sys("mmap of a guard page");
	}
	if (p != (void *)end) /* a kernel before 4.17 takes the flag as a hint */
		fail("the guard page went to %p, not %p", p, (void *)end);
	return p;
}

/* `g` grown to `bytes`, the new pages zero in the model. */
static void grow_region(struct region *g, unsigned char *base, size_t bytes)
{
	g->base = base;
	size_t old_pages = g->pages;
	g->pages = bytes / PAGE;
	g->want = grow_wants(g->want, g->pages);
	for (size_t i = old_pages; i < g->pages; i++)
		g->want[i] = (struct want){ .kind = WANT_ZERO };
}

/* Step 3: mremap: move 8 MiB of A elsewhere; grow a region C that must move (a guard page right
 * after it), and a region D in place (its reservation's upper half unmapped first). Whether an
 * unforced MAYMOVE grow moves depends on what is mapped next to it: the kernel reports a
 * UFFD_EVENT_REMAP only for a move, so each case is made certain. The moved part and both grown
 * regions are checked again at the end. */
static void step_mremap(struct checker *c, struct region *moved, struct region *grown,
			struct region *grown_in_place)
{
	pressure(&c->scratch, 4);
	struct region *a = &c->a;
	const size_t moved_pages = 8 * MIB / PAGE;
	const size_t first = 8 * MIB / PAGE;
	unsigned char *target = map_anonymous(8 * MIB);
	/* Moving part of A onto `target` (MREMAP_FIXED replaces that reservation). */
	void *newp = mremap(page_at(a, first), 8 * MIB, 8 * MIB, MREMAP_MAYMOVE | MREMAP_FIXED, target);
	if (newp == MAP_FAILED)
		fail_sys("mremap failed");
	if (newp != (void *)target)
		fail("mremap moved to %p, not %p", newp, (void *)target);
	*moved = (struct region){ .base = target, .pages = moved_pages, .name = "A-moved" };
	moved->want = new_wants(moved_pages);
	memcpy(moved->want, a->want + first, moved_pages * sizeof *moved->want);
	/* The old range is unmapped now: stop tracking it in A. */
	for (size_t i = first; i < first + moved_pages; i++)
		a->want[i] = (struct want){ .kind = WANT_UNMAPPED };
	pressure(&c->scratch, 5);
	size_t bad = verify(moved, "mremap move");
	report(c, "mremap move", bad);

	struct region g = region_new("C", 4 * MIB);
	void *guard = guard_after(g.base + 4 * MIB);
	for (size_t i = 0; i < g.pages; i++)
		region_write(&g, i, 500000 + (uint64_t)i, 0);
	pressure(&c->scratch, 6);
	void *bigger = mremap(g.base, 4 * MIB, 8 * MIB, MREMAP_MAYMOVE);
	if (bigger == MAP_FAILED)
		fail_sys("mremap grow failed");
	if (bigger == (void *)g.base)
		fail("mremap grew C in place at %p past its guard page", bigger);
	if (guard && munmap(guard, PAGE) == -1)
		fail_sys("munmap of the guard page");
	grow_region(&g, bigger, 8 * MIB);
	pressure(&c->scratch, 7);
	bad = verify(&g, "mremap grow");
	report(c, "mremap grow", bad);

	/* D: 8 MiB reserved, the upper half given back, the lower half written and evicted, then
	 * grown in place (no MAYMOVE): the grown pages are in the same registered mapping, but
	 * were never in any range the daemon learned; they must read zero and page like the rest. */
	struct region d = region_new("D", 8 * MIB);
	if (munmap(d.base + 4 * MIB, 4 * MIB) == -1)
		fail_sys("munmap of D's upper half");
	d.pages = 4 * MIB / PAGE;
	for (size_t i = 0; i < d.pages; i++)
		region_write(&d, i, 600000 + (uint64_t)i, 0);
	pressure(&c->scratch, 8);
	void *same = mremap(d.base, 4 * MIB, 8 * MIB, 0);
	if (same == MAP_FAILED)
		fail_sys("mremap grow in place failed (something mapped into D's upper half?)");
	grow_region(&d, same, 8 * MIB);
	bad = verify(&d, "mremap grow in place");
	for (size_t i = 0; i < d.pages; i++)
		region_write(&d, i, 700000 + (uint64_t)i, 1);
	pressure(&c->scratch, 9);
	bad += verify(&d, "mremap grow in place");
	report(c, "mremap grow in place", bad);

	for (size_t i = 0; i < moved->pages; i++)
		region_write(moved, i, 800000 + (uint64_t)i, 1);
	*grown = g;
	*grown_in_place = d;
}

/* Step 4: munmap part of A with evicted pages, map fresh memory there: it must read zeros. */
static void step_munmap(struct checker *c)
{
	pressure(&c->scratch, 8);
	struct region *a = &c->a;
	const size_t un = 16 * MIB / PAGE;
	const size_t un_pages = 4 * MIB / PAGE;
	unsigned char *at = page_at(a, un);
	if (munmap(at, 4 * MIB) != 0)
		fail_sys("munmap");
	void *p = mmap(at, 4 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (p == MAP_FAILED)
		fail_sys("mmap MAP_FIXED");
	if (p != (void *)at)
		fail("mmap MAP_FIXED mapped %p, not %p", p, (void *)at);
	for (size_t i = un; i < un + un_pages; i++)
		a->want[i] = (struct want){ .kind = WANT_ZERO };
	size_t bad = verify(a, "munmap");
	report(c, "munmap + new mapping reads zeros", bad);
}

/* Step 5: MADV_DONTNEED over evicted and resident pages: zeros there, the rest intact. */
static void step_dontneed(struct checker *c)
{
	pressure(&c->scratch, 9);
	struct region *a = &c->a;
	const size_t dn = 20 * MIB / PAGE;
	for (size_t i = dn; i < dn + 64; i++)
		region_write(a, i, (uint64_t)i, 11); /* some of the range resident, the rest evicted */
	if (madvise(page_at(a, dn), 4 * MIB, MADV_DONTNEED) != 0)
		fail_sys("madvise(MADV_DONTNEED)");
	for (size_t i = dn; i < dn + 4 * MIB / PAGE; i++)
		a->want[i] = (struct want){ .kind = WANT_ZERO };
	pressure(&c->scratch, 10);
	size_t bad = verify(a, "dontneed");
	report(c, "MADV_DONTNEED reads zeros", bad);
}

/*
 * Step 6: readahead. On a sequential run of faults the daemon restores the evicted pages after
 * the faulting one with it (a window growing to 16 pages). Here the woken thread at once writes
 * the next page and drops the one after it (MADV_DONTNEED): pages that readahead restored, or
 * that a daemon copying a run in two steps would still be copying. The writes must stay, the
 * dropped pages read zeros, the others keep their contents. A's last quarter still holds its
 * first fill.
 */
static void step_readahead(struct checker *c)
{
	const size_t ra = 24 * MIB / PAGE;
	for (uint64_t round = 0; round < 3; round++) {
		pressure(&c->scratch, 20 + round);
		struct region *a = &c->a;
		for (size_t i = ra; i + 4 <= a->pages; i += 4) {
			/* A volatile read, so that it really faults. */
			(void)*(volatile const unsigned char *)page_at(a, i);
			region_write(a, i + 1, (uint64_t)i + 1, 30 + round);
			if (madvise(page_at(a, i + 2), PAGE, MADV_DONTNEED) != 0)
				fail_sys("madvise(MADV_DONTNEED)");
			a->want[i + 2] = (struct want){ .kind = WANT_ZERO };
		}
		size_t bad = verify(a, "readahead");
		report(c, "readahead: writes and drops next to restored runs", bad);
	}
}

/* Step 7: everything, once more, after more pressure; the exit status. */
static int step_finally(struct checker *c, const struct region *moved, const struct region *grown,
			const struct region *grown_in_place)
{
	pressure(&c->scratch, 11);
	/* One at a time: their MISMATCH lines come out in this order. */
	size_t bad = verify(&c->a, "final A");
	bad += verify(moved, "final moved");
	bad += verify(grown, "final C");
	bad += verify(grown_in_place, "final D");
	bad += verify(&c->scratch, "final scratch");
	report(c, "final", bad);
	if (c->failures == 0) {
		say("checker: ALL OK\n");
		return 0;
	}
	say("checker: %zu failures\n", c->failures);
	return 1;
}

/* Every step in order; 0 when every page of every step matched. */
static int all(void)
{
	struct checker c;
	struct region moved, grown, grown_in_place;
	step_fill(&c);
	step_kernel_mode_faults(&c);
	step_fork(&c);
	step_mremap(&c, &moved, &grown, &grown_in_place);
	step_munmap(&c);
	step_dontneed(&c);
	step_readahead(&c);
	int code = step_finally(&c, &moved, &grown, &grown_in_place);
	/* The models; the mappings go with the process, as the Rust checker left them. */
	free(c.a.want);
	free(c.scratch.want);
	free(moved.want);
	free(grown.want);
	free(grown_in_place.want);
	return code;
}

static int hold(void)
{
	struct region a = region_new("A", 32 * MIB);
	for (size_t i = 0; i < a.pages; i++)
		region_write(&a, i, (uint64_t)i, 0);
	say("READY %ld\n", (long)getpid());
	for (unsigned long long round = 0;; round++) {
		size_t bad = verify(&a, "hold");
		say("round %llu: %zu bad pages\n", round, bad);
		if (bad != 0) {
			free(a.want);
			return 1;
		}
	}
}

/* The mode as Rust's `{:?}` writes a string: quoted, with quotes, backslashes and control
 * characters escaped (other bytes as they are). */
static void put_debug_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"':
			fputs("\\\"", f);
			break;
		case '\\':
			fputs("\\\\", f);
			break;
		case '\n':
			fputs("\\n", f);
			break;
		case '\r':
			fputs("\\r", f);
			break;
		case '\t':
			fputs("\\t", f);
			break;
		default:
			if (*p < 0x20 || *p == 0x7f)
				fprintf(f, "\\u{%x}", (unsigned)*p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

int main(int argc, char **argv)
{
	/* As a Rust program does: a closed stdout is an error to report, not a silent SIGPIPE. */
	if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
		fail_sys("ignoring SIGPIPE");
	const char *mode = argc > 1 ? argv[1] : "all";
	int code;
	if (strcmp(mode, "all") == 0) {
		code = all();
	} else if (strcmp(mode, "hold") == 0) {
		code = hold();
	} else {
		fputs("uffd-checker: unknown mode ", stderr);
		put_debug_string(stderr, mode);
		fputs(" (all, hold)\n", stderr);
		code = 2;
	}
	if (fflush(stdout) != 0)
		fail_sys("writing to stdout");
	return code;
}
