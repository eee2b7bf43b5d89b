/*
 * remap_race MIB ROUNDS: in each round, fill a region A of MIB MiB with words of that round,
 * then move it with mremap(MREMAP_FIXED) over a region B of the same size that holds other
 * words and is being evicted (a thread keeps reading B's pages, so reclaim keeps picking them),
 * then check every word at B's address; then B is A, and a new A is made. Prints
 * "remap_race: ROUNDS rounds, W bad words (Z zeros) on P pages" and exits non-zero if a word
 * was wrong.
 *
 * Under the daemon, a DROP chosen before the mremap names B's addresses. The mremap raises
 * UNMAP (of B) and REMAP (A to B) on the daemon's uffd, and until the handler has read them the
 * kernel answers the agent's UFFDIO_MOVE with EAGAIN. The agent retried at once, so its move
 * ran in the moment after the handler read the event and before it applied it: it moved A's
 * page, now at B's address, into its scratch, and the daemon, which no longer counted that
 * address as part of the DROP, freed it. The program then read zeros there.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static _Atomic(uint64_t *) target;
static size_t words;
static atomic_int stop;

static uint64_t word(uint64_t round, size_t i) { return ((round + 1) * 0x9e3779b97f4a7c15ull) ^ (i * 0xff51afd7ed558ccdull) ^ 1; }

/* Reads pages of whatever region is the target (B), so that its pages go on being evicted and
 * brought back while the main thread moves A over it. */
static void *reader(void *arg)
{
	uint64_t x = (uintptr_t)arg * 7919 + 1, sum = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		volatile uint64_t *m = atomic_load_explicit(&target, memory_order_acquire);
		sum += m[(x % (words / 512)) * 512];
	}
	return (void *)(uintptr_t)sum;
}

static uint64_t *fill(uint64_t round, size_t bytes)
{
	uint64_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		perror("remap_race: mmap");
		exit(2);
	}
	for (size_t i = 0; i < words; i++)
		m[i] = word(round, i);
	return m;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: remap_race MIB ROUNDS\n");
		return 2;
	}
	size_t bytes = (size_t)atol(argv[1]) << 20;
	int rounds = atoi(argv[2]);
	words = bytes / 8;
	uint64_t *b = fill(0, bytes);
	atomic_store(&target, b);
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, reader, (void *)(uintptr_t)(i + 1)) != 0) {
			fprintf(stderr, "remap_race: pthread_create failed\n");
			return 2;
		}
	uint64_t bad = 0, zeros = 0, pages = 0;
	for (int r = 1; r <= rounds; r++) {
		uint64_t *a = fill((uint64_t)r, bytes);
		/* The readers go on reading B until the move replaces it: same address, A's words. */
		uint64_t *moved = mremap(a, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, b);
		if (moved != b) {
			perror("remap_race: mremap");
			return 2;
		}
		for (size_t p = 0; p < words / 512; p++) {
			uint64_t page_bad = 0;
			for (size_t i = p * 512; i < (p + 1) * 512; i++) {
				uint64_t v = b[i];
				if (v != word((uint64_t)r, i)) {
					page_bad++;
					zeros += v == 0;
				}
			}
			bad += page_bad;
			pages += page_bad > 0;
		}
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	printf("remap_race: %d rounds, %llu bad words (%llu zeros) on %llu pages\n", rounds,
	       (unsigned long long)bad, (unsigned long long)zeros, (unsigned long long)pages);
	return bad != 0;
}
