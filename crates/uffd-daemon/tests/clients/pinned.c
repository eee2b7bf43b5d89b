/*
 * Pinned memory under the daemon: a buffer that the kernel writes through a pin (FOLL_PIN), not
 * through the page tables, while the rest of the program's memory is paged. Built dynamic (the
 * agent) and static (no agent) by the tests; raw io_uring system calls, no liburing.
 *
 *   pinned MODE BUF_MIB OTHER_MIB ROUNDS
 *
 *   fixed          BUF is registered as io_uring fixed buffers once (IORING_REGISTER_BUFFERS:
 *                  a FOLL_LONGTERM pin of every page for as long as they are registered) and
 *                  filled with IORING_OP_READ_FIXED from the page cache
 *   fixed-direct   the same, the file opened with O_DIRECT (the device writes the pinned pages)
 *   cycle          BUF is registered at the start of each round and unregistered (unpinned)
 *                  at its end, before the check: the pin goes away while the daemon may be
 *                  holding a copy of a page read before the last writes through it
 *   direct         BUF is plain memory, filled with O_DIRECT reads of 64 KiB, all of a pass in
 *                  flight at once: a short-term pin of each page while the device writes it
 *   fixed-shared, direct-shared  as fixed and direct, BUF mapped MAP_SHARED|MAP_ANONYMOUS (shared
 *                  anonymous memory, which the daemon pages by punching the inode: a punch takes
 *                  a pinned page out of the page cache all the same, probe p5)
 *
 * Each round fills the whole buffer PASSES times in a row (direct: once), each pass from another
 * offset of a file of known contents (so that each pass's contents differ, page by page, from
 * every earlier pass's), then checks every word of the buffer through the program's own mapping
 * against the last pass. Meanwhile OTHER_MIB MiB of other memory are paged (each word checked,
 * then rewritten): by a second thread, all the time (twice over at least), in the fixed modes;
 * a quarter of it per round, by this thread while the round's reads are in flight, in direct
 * mode (where reclaim must meet pages whose reads are still in flight). At the end every word of
 * the other memory is checked once more. It prints
 *   MODE: R rounds, B MiB buffer, N bad words, F failed reads
 *   other: O MiB, N bad words
 * and, for the first few wrong words, what they hold (an earlier pass's contents, zeros, ...).
 * Exit status 0 only when every word was right.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096ul
#define RING 256u
#define DIRECT_CHUNK (64ul << 10)
#define FIXED_CHUNK (256ul << 10)
#define QUEUE 32u
#define PASSES 4u

/* The file's word at word index w. */
static uint64_t file_word(uint64_t w)
{
	uint64_t z = w + 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Pass p (counted over all rounds) reads the buffer from this file offset. */
static uint64_t pass_offset(unsigned p)
{
	return (uint64_t)p * PAGE;
}

/* The other memory's word i (eight words alike: it compresses, as most memory does). */
static uint64_t other_word(uint64_t seed, size_t i)
{
	return seed ^ ((i >> 3) * 0x9e3779b97f4a7c15ull) ^ 0x5555;
}

struct ring {
	int fd;
	unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
	unsigned *cq_head, *cq_tail, *cq_mask;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
};

static void die(const char *what)
{
	fprintf(stderr, "pinned: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void ring_init(struct ring *r)
{
	struct io_uring_params p;
	memset(&p, 0, sizeof p);
	r->fd = (int)syscall(__NR_io_uring_setup, RING, &p);
	if (r->fd < 0)
		die("io_uring_setup");
	size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	uint8_t *sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
			   IORING_OFF_SQ_RING);
	uint8_t *cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
			   IORING_OFF_CQ_RING);
	r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
	if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED)
		die("mmap of the rings");
	r->sq_head = (unsigned *)(sq + p.sq_off.head);
	r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
	r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
	r->sq_array = (unsigned *)(sq + p.sq_off.array);
	r->cq_head = (unsigned *)(cq + p.cq_off.head);
	r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
	r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
	r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
}

/* Queues one read (fixed: of registered buffer 0). */
static void queue_read(struct ring *r, int file, int fixed, void *to, size_t len, uint64_t off,
		       uint64_t tag)
{
	unsigned tail = *r->sq_tail;
	unsigned i = tail & *r->sq_mask;
	struct io_uring_sqe *s = &r->sqes[i];
	memset(s, 0, sizeof *s);
	s->opcode = fixed ? IORING_OP_READ_FIXED : IORING_OP_READ;
	s->fd = file;
	s->addr = (uint64_t)(uintptr_t)to;
	s->len = (uint32_t)len;
	s->off = off;
	s->buf_index = 0;
	s->user_data = tag;
	r->sq_array[i] = i;
	atomic_store_explicit((_Atomic unsigned *)r->sq_tail, tail + 1, memory_order_release);
}

static void submit(struct ring *r, unsigned n)
{
	while (n > 0) {
		long got = syscall(__NR_io_uring_enter, r->fd, n, 0, 0, NULL, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			die("io_uring_enter (submit)");
		n -= (unsigned)got;
	}
}

/* Waits for `n` completions; each must have read `len` bytes. Returns the failures. */
static unsigned reap(struct ring *r, unsigned n, size_t len)
{
	unsigned bad = 0;
	while (n > 0) {
		unsigned head = *r->cq_head;
		unsigned tail = atomic_load_explicit((_Atomic unsigned *)r->cq_tail, memory_order_acquire);
		if (head == tail) {
			long got = syscall(__NR_io_uring_enter, r->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0);
			if (got < 0 && errno != EINTR)
				die("io_uring_enter (wait)");
			continue;
		}
		struct io_uring_cqe *c = &r->cqes[head & *r->cq_mask];
		if (c->res != (int)len) {
			fprintf(stderr, "pinned: read %llu returned %d (%s)\n",
				(unsigned long long)c->user_data, c->res,
				c->res < 0 ? strerror(-c->res) : "short");
			bad++;
		}
		atomic_store_explicit((_Atomic unsigned *)r->cq_head, head + 1, memory_order_release);
		n--;
	}
	return bad;
}

/* The data file: O_TMPFILE in $PINNED_DIR (default /var/tmp), `bytes` of file_word(). */
static int make_file(size_t bytes, int direct)
{
	const char *dir = getenv("PINNED_DIR");
	int fd = open(dir ? dir : "/var/tmp", O_TMPFILE | O_RDWR, 0600);
	if (fd < 0)
		die("open O_TMPFILE");
	uint64_t *chunk = malloc(1 << 20);
	if (!chunk)
		die("malloc");
	for (size_t at = 0; at < bytes; at += 1 << 20) {
		size_t n = bytes - at < (1 << 20) ? bytes - at : (1 << 20);
		for (size_t i = 0; i < n / 8; i++)
			chunk[i] = file_word(at / 8 + i);
		if (pwrite(fd, chunk, n, (off_t)at) != (ssize_t)n)
			die("pwrite");
	}
	free(chunk);
	if (fsync(fd) < 0)
		die("fsync");
	if (direct) {
		/* Every read goes to the device: nothing of the file stays cached. */
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		if (fcntl(fd, F_SETFL, O_DIRECT) < 0)
			die("fcntl O_DIRECT");
	}
	return fd;
}

/* Says what a wrong word holds (the last pass was `last`), for the first few. */
static void explain(const uint64_t *buf, size_t j, unsigned last, long nth)
{
	if (nth >= 8)
		return;
	uint64_t v = buf[j];
	const char *what = "something else";
	char tmp[64];
	if (v == 0) {
		what = "zero";
	} else {
		for (unsigned k = 1; k <= last; k++)
			if (v == file_word(pass_offset(last - k) / 8 + j)) {
				snprintf(tmp, sizeof tmp, "pass %u's contents (%u passes stale)", last - k, k);
				what = tmp;
				break;
			}
	}
	fprintf(stderr, "pinned: pass %u, page %zu, word %zu: %#llx, expected %#llx: %s\n", last,
		j * 8 / PAGE, j % (PAGE / 8), (unsigned long long)v,
		(unsigned long long)file_word(pass_offset(last) / 8 + j), what);
}

/* The other memory and the thread that pages it. */
struct pressure {
	uint64_t *mem;
	size_t words;
	atomic_int stop;
	atomic_int passes;
	long bad;
	uint64_t seed;
	size_t at; /* the next word to check and rewrite */
};

/* Checks and rewrites the next `words` words of the other memory (a pass over all of it
 * rewrites it with a new seed). */
static void press(struct pressure *p, size_t words)
{
	for (size_t k = 0; k < words; k++, p->at++) {
		if (p->at == p->words) {
			p->at = 0;
			p->seed += 7919;
			atomic_fetch_add(&p->passes, 1);
		}
		if (p->mem[p->at] != other_word(p->seed, p->at))
			p->bad++;
		p->mem[p->at] = other_word(p->seed + 7919, p->at);
	}
}

static void *pressure(void *arg)
{
	struct pressure *p = arg;
	while (!atomic_load(&p->stop))
		press(p, 1 << 16);
	return NULL;
}

/* Checks every word of the other memory (after the last `press`). */
static long check_other(struct pressure *p)
{
	long bad = p->bad;
	for (size_t i = 0; i < p->words; i++)
		if (p->mem[i] != other_word(i < p->at ? p->seed + 7919 : p->seed, i))
			bad++;
	return bad;
}

/* Fills the buffer from the file at pass_offset(pass): one read per chunk, up to `queue` in
 * flight; with `pr`, all of them are queued at once and `press_words` of the other memory are
 * paged while they are in flight. Returns the reads that failed. */
static unsigned fill(struct ring *ring, int file, int fixed, uint8_t *buf, size_t bytes,
		     size_t chunk, unsigned pass, unsigned queue, struct pressure *pr,
		     size_t press_words)
{
	unsigned n = (unsigned)(bytes / chunk), queued = 0, inflight = 0, bad = 0;
	if (pr) {
		for (; queued < n; queued++)
			queue_read(ring, file, fixed, buf + queued * chunk, chunk,
				   pass_offset(pass) + queued * chunk, (uint64_t)pass << 16 | queued);
		submit(ring, n);
		press(pr, press_words);
		return reap(ring, n, chunk);
	}
	while (queued < n || inflight > 0) {
		unsigned k = 0;
		while (queued < n && inflight < queue) {
			queue_read(ring, file, fixed, buf + queued * chunk, chunk,
				   pass_offset(pass) + queued * chunk, (uint64_t)pass << 16 | queued);
			queued++, inflight++, k++;
		}
		submit(ring, k);
		bad += reap(ring, 1, chunk);
		inflight--;
	}
	return bad;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: pinned fixed|fixed-direct|cycle|direct BUF_MIB OTHER_MIB ROUNDS\n");
		return 2;
	}
	const char *mode = argv[1];
	int cycle = !strcmp(mode, "cycle");
	int fixed = !strncmp(mode, "fixed", 5) || cycle;
	int direct = !strcmp(mode, "direct") || !strcmp(mode, "fixed-direct") || !strcmp(mode, "direct-shared");
	int shared_buf = strstr(mode, "-shared") != NULL;
	if (!fixed && !direct) {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	size_t buf_bytes = strtoul(argv[2], NULL, 10) << 20;
	size_t other_bytes = strtoul(argv[3], NULL, 10) << 20;
	unsigned rounds = (unsigned)strtoul(argv[4], NULL, 10);
	size_t chunk = fixed ? FIXED_CHUNK : DIRECT_CHUNK;
	unsigned passes = fixed ? PASSES : 1;
	if (buf_bytes == 0 || buf_bytes % chunk || buf_bytes / chunk > RING || other_bytes == 0) {
		fprintf(stderr, "pinned: bad sizes\n");
		return 2;
	}
	int file = make_file(buf_bytes + pass_offset(rounds * passes), direct);

	/* Private anonymous memory, as malloc would give (but aligned for O_DIRECT), or shared. */
	uint64_t *buf = mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE,
			     (shared_buf ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
	uint64_t *other = mmap(NULL, other_bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED || other == MAP_FAILED)
		die("mmap");
	memset(buf, 0xa5, buf_bytes);
	struct pressure pr = { .mem = other, .words = other_bytes / 8, .seed = 1000 };
	for (size_t i = 0; i < pr.words; i++)
		other[i] = other_word(pr.seed, i);

	struct ring ring;
	ring_init(&ring);
	struct iovec iov = { .iov_base = buf, .iov_len = buf_bytes };
	if (fixed && !cycle &&
	    syscall(__NR_io_uring_register, ring.fd, IORING_REGISTER_BUFFERS, &iov, 1) < 0)
		die("IORING_REGISTER_BUFFERS");
	pthread_t t;
	if (fixed && pthread_create(&t, NULL, pressure, &pr) != 0)
		die("pthread_create");

	long bad = 0;
	unsigned failed_reads = 0;
	for (unsigned r = 0; r < rounds; r++) {
		unsigned last = r * passes + passes - 1;
		if (cycle && syscall(__NR_io_uring_register, ring.fd, IORING_REGISTER_BUFFERS, &iov, 1) < 0)
			die("IORING_REGISTER_BUFFERS");
		for (unsigned p = r * passes; p <= last; p++)
			failed_reads += fill(&ring, file, fixed, (uint8_t *)buf, buf_bytes, chunk, p,
					     QUEUE, fixed ? NULL : &pr, pr.words / 4);
		if (cycle && syscall(__NR_io_uring_register, ring.fd, IORING_UNREGISTER_BUFFERS, NULL, 0) < 0)
			die("IORING_UNREGISTER_BUFFERS");
		/* Every word of the buffer, through the program's own mapping. */
		for (size_t j = 0; j < buf_bytes / 8; j++)
			if (buf[j] != file_word(pass_offset(last) / 8 + j))
				explain(buf, j, last, bad++);
	}
	if (fixed) {
		/* (At least two passes over the other memory, however fast the rounds went.) */
		while (atomic_load(&pr.passes) < 2)
			usleep(1000);
		atomic_store(&pr.stop, 1);
		pthread_join(t, NULL);
	}
	if (fixed && !cycle &&
	    syscall(__NR_io_uring_register, ring.fd, IORING_UNREGISTER_BUFFERS, NULL, 0) < 0)
		die("IORING_UNREGISTER_BUFFERS");
	long other_bad = check_other(&pr);
	printf("%s: %u rounds, %zu MiB buffer, %ld bad words, %u failed reads\n", mode, rounds,
	       buf_bytes >> 20, bad, failed_reads);
	printf("other: %zu MiB, %ld bad words\n", other_bytes >> 20, other_bad);
	return bad != 0 || other_bad != 0 || failed_reads != 0;
}
