/*
 * Many threads reading and writing their own pages at random while they also throw pages away
 * with MADV_DONTNEED: a check that a page restored for one thread's fault is never the copy of
 * a page another fault, or a removal, has since replaced.
 *
 * Usage: stripes_dontneed MIB THREADS ROUNDS
 *
 * The buffer (one mmap'd anonymous region) is cut into one stripe of pages per thread. Every
 * word of a page holds the page's number and its version; a thread keeps the version of each of
 * its pages (0: never written or thrown away, so zeros). Each round a thread picks one of its
 * pages at random, checks every word of it against what it expects, then writes a new version
 * (three rounds in four) or throws the page away with MADV_DONTNEED (one in sixteen, after which
 * it must read zeros). Prints one line of results, the same for every run of the same arguments,
 * and exits 1 if a word was wrong.
 *
 * Compiled at test time by tests/tiers.rs with the system's cc.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static uint64_t *buf;
static size_t pages_per_thread;
static long rounds;

struct worker {
	pthread_t thread;
	unsigned index;
	uint32_t *version;
	size_t bad_words;
	size_t removed;
};

static uint64_t word_of(size_t page, uint32_t version)
{
	return version == 0 ? 0 : ((uint64_t)page << 32) | version;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	uint64_t x = 0x9E3779B97F4A7C15ull * (w->index + 1);
	size_t first = (size_t)w->index * pages_per_thread;

	/* Every page written once: the whole buffer is data, most of it evicted. */
	for (size_t i = 0; i < pages_per_thread; i++) {
		uint64_t *p = buf + (first + i) * WORDS;
		w->version[i] = 1;
		for (size_t k = 0; k < WORDS; k++)
			p[k] = word_of(first + i, 1);
	}
	for (long r = 0; r < rounds; r++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t i = (x >> 8) % pages_per_thread;
		uint64_t *p = buf + (first + i) * WORDS;
		uint64_t want = word_of(first + i, w->version[i]);
		for (size_t k = 0; k < WORDS; k++)
			w->bad_words += p[k] != want;
		unsigned what = x & 15;
		if (what == 0) {
			if (madvise(p, PAGE, MADV_DONTNEED) != 0) {
				perror("madvise");
				exit(2);
			}
			w->version[i] = 0;
			w->removed++;
		} else if (what < 12) {
			uint32_t v = w->version[i] + 1;
			for (size_t k = 0; k < WORDS; k++)
				p[k] = word_of(first + i, v);
			w->version[i] = v;
		}
	}
	/* Every page checked at the end. */
	for (size_t i = 0; i < pages_per_thread; i++) {
		uint64_t *p = buf + (first + i) * WORDS;
		uint64_t want = word_of(first + i, w->version[i]);
		for (size_t k = 0; k < WORDS; k++)
			w->bad_words += p[k] != want;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s MIB THREADS ROUNDS\n", argv[0]);
		return 2;
	}
	size_t bytes = (size_t)atol(argv[1]) << 20;
	unsigned threads = (unsigned)atoi(argv[2]);
	rounds = atol(argv[3]);
	if (threads == 0 || bytes / PAGE < threads) {
		fprintf(stderr, "too many threads for the size\n");
		return 2;
	}
	pages_per_thread = bytes / PAGE / threads;
	buf = mmap(NULL, pages_per_thread * threads * PAGE, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("mmap");
		return 2;
	}
	struct worker *w = calloc(threads, sizeof(*w));
	for (unsigned t = 0; t < threads; t++) {
		w[t].index = t;
		w[t].version = calloc(pages_per_thread, sizeof(uint32_t));
		pthread_create(&w[t].thread, NULL, work, &w[t]);
	}
	size_t bad = 0, removed = 0;
	for (unsigned t = 0; t < threads; t++) {
		pthread_join(w[t].thread, NULL);
		bad += w[t].bad_words;
		removed += w[t].removed;
	}
	printf("stripes_dontneed: %u threads, %zu pages each, %ld rounds, %zu bad words\n",
	       threads, pages_per_thread, rounds, bad);
	fprintf(stderr, "stripes_dontneed: %zu pages thrown away\n", removed);
	return bad != 0;
}
