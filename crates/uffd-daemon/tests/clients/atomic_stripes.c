/*
 * Many threads on one large malloc'd buffer: a check that no update is lost while the pages
 * under them are evicted and read back.
 *
 * Usage: atomic_stripes MIB THREADS ROUNDS
 *
 * The buffer is split in two halves. In the first, every thread adds 1 with __atomic_fetch_add
 * to words picked at random (a xorshift generator per thread), ROUNDS times; at the end the
 * words must add up to THREADS * ROUNDS. The second half is cut in one stripe per thread; each
 * thread fills its stripe with plain stores of a pattern derived from its index, between the
 * atomic rounds, and reads it back at the end. Prints one line of results (the same on every
 * run of the same arguments) and exits 1 if an update or a store was lost.
 *
 * Compiled at test time by tests/compat.rs with the system's cc.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t *counters;
static size_t ncounters;
static uint64_t *stripes;
static size_t stripe_words;
static long rounds;

struct worker {
	pthread_t thread;
	unsigned index;
	size_t bad_words;
};

static uint64_t pattern(unsigned thread, size_t word)
{
	return ((uint64_t)thread << 48) ^ (word * 0x9E3779B97F4A7C15ull);
}

static void *work(void *arg)
{
	struct worker *w = arg;
	uint64_t x = 0x2545F4914F6CDD1Dull * (w->index + 1);
	uint64_t *mine = stripes + (size_t)w->index * stripe_words;
	size_t step = stripe_words * 64 / (size_t)(rounds + 1) + 1;
	size_t next_store = 0;

	for (long r = 0; r < rounds; r++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		__atomic_fetch_add(&counters[x % ncounters], 1, __ATOMIC_RELAXED);
		/* Plain stores to the stripe, spread over the rounds. */
		if (r % 64 == 0) {
			size_t end = next_store + step;
			for (; next_store < end && next_store < stripe_words; next_store++)
				mine[next_store] = pattern(w->index, next_store);
		}
	}
	for (; next_store < stripe_words; next_store++)
		mine[next_store] = pattern(w->index, next_store);
	return NULL;
}

static void *check(void *arg)
{
	struct worker *w = arg;
	uint64_t *mine = stripes + (size_t)w->index * stripe_words;

	w->bad_words = 0;
	for (size_t i = 0; i < stripe_words; i++)
		if (mine[i] != pattern(w->index, i))
			w->bad_words++;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s MIB THREADS ROUNDS\n", argv[0]);
		return 2;
	}
	size_t bytes = (size_t)atol(argv[1]) << 20;
	unsigned nthreads = (unsigned)atoi(argv[2]);
	rounds = atol(argv[3]);
	size_t words = bytes / sizeof(uint64_t);

	uint64_t *buf = malloc(bytes);
	if (!buf || nthreads == 0) {
		perror("malloc");
		return 2;
	}
	counters = buf;
	ncounters = words / 2;
	stripes = buf + ncounters;
	stripe_words = (words - ncounters) / nthreads;
	for (size_t i = 0; i < ncounters; i++)
		counters[i] = 0;

	struct worker *ws = calloc(nthreads, sizeof(*ws));
	for (unsigned t = 0; t < nthreads; t++) {
		ws[t].index = t;
		if (pthread_create(&ws[t].thread, NULL, work, &ws[t])) {
			perror("pthread_create");
			return 2;
		}
	}
	for (unsigned t = 0; t < nthreads; t++)
		pthread_join(ws[t].thread, NULL);
	for (unsigned t = 0; t < nthreads; t++)
		pthread_create(&ws[t].thread, NULL, check, &ws[t]);
	size_t bad_words = 0;
	for (unsigned t = 0; t < nthreads; t++) {
		pthread_join(ws[t].thread, NULL);
		bad_words += ws[t].bad_words;
	}

	uint64_t sum = 0;
	size_t touched = 0;
	for (size_t i = 0; i < ncounters; i++) {
		sum += counters[i];
		touched += counters[i] != 0;
	}
	uint64_t expected = (uint64_t)nthreads * (uint64_t)rounds;
	printf("atomic_stripes: %u threads, %zu MiB: sum %llu of %llu expected, %zu words touched, "
	       "%zu bad stripe words\n",
	       nthreads, bytes >> 20, (unsigned long long)sum, (unsigned long long)expected, touched,
	       bad_words);
	if (sum != expected)
		printf("LOST UPDATES: %lld\n", (long long)(expected - sum));
	if (bad_words)
		printf("LOST STORES: %zu words\n", bad_words);
	return sum == expected && bad_words == 0 ? 0 : 1;
}
