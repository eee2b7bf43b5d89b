/*
 * An access pattern over checked pages, for the daemon's readahead tests.
 *
 * Usage: readahead MODE MIB TOUCHES
 *
 * Maps MIB MiB of private anonymous memory and writes every page with a pattern of (page,
 * generation), then makes TOUCHES touches in MODE:
 *   random      one page picked at random;
 *   pairs       an 8 KiB record at a random even page: the page, then the next one (adjacent
 *               faults that a readahead window keyed on adjacency alone reads ahead for);
 *   sequential  pages in order, wrapping.
 * Each touch verifies the whole page against the pattern of its generation and writes the
 * next generation. At the end every page is verified once more, in random order (so that
 * the end adds no sequential stream of its own). Prints one line and exits 1 on any mismatch,
 * naming the page.
 *
 * Compiled at test time by tests/readahead.rs with the system's cc.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGE 4096
#define WORDS (PAGE / 8)
/* Words of each page derived from (page, generation); the rest repeat them, so that a page
 * compresses (the zswap tier keeps what compresses). */
#define FRESH 64

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void pattern(uint64_t *out, size_t page, uint32_t gen)
{
	uint64_t s = ((uint64_t)page << 32) ^ gen ^ 0x5EEDull;
	out[0] = ((uint64_t)page << 24) | gen;
	for (size_t k = 1; k < FRESH; k++)
		out[k] = splitmix(&s);
	for (size_t k = FRESH; k < WORDS; k++)
		out[k] = out[k % FRESH];
}

static uint64_t *mem;
static uint32_t *gens;
static size_t bad;

static void check(size_t page, uint64_t *want)
{
	uint64_t *p = mem + page * WORDS;
	pattern(want, page, gens[page]);
	if (memcmp(p, want, PAGE) != 0) {
		size_t k = 0;
		while (p[k] == want[k])
			k++;
		if (bad++ < 5)
			fprintf(stderr,
				"readahead: MISMATCH at page %zu (generation %u): word %zu is %#llx, "
				"expected %#llx\n",
				page, gens[page], k, (unsigned long long)p[k],
				(unsigned long long)want[k]);
	}
}

static void touch(size_t page, uint64_t *want)
{
	check(page, want);
	gens[page]++;
	pattern(mem + page * WORDS, page, gens[page]);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: readahead random|pairs|sequential MIB TOUCHES\n");
		return 2;
	}
	const char *mode = argv[1];
	size_t pages = (size_t)strtoull(argv[2], NULL, 10) * (1 << 20) / PAGE;
	long touches = strtol(argv[3], NULL, 10);
	if (pages < 2 || touches < 0 ||
	    (strcmp(mode, "random") && strcmp(mode, "pairs") && strcmp(mode, "sequential"))) {
		fprintf(stderr, "readahead: bad arguments\n");
		return 2;
	}
	mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gens = calloc(pages, sizeof(*gens));
	if (mem == MAP_FAILED || !gens) {
		perror("readahead: mmap");
		return 2;
	}
	static uint64_t want[WORDS];
	for (size_t i = 0; i < pages; i++)
		pattern(mem + i * WORDS, i, 0);

	uint64_t x = 42;
	for (long t = 0; t < touches; t++) {
		if (!strcmp(mode, "random")) {
			touch(splitmix(&x) % pages, want);
		} else if (!strcmp(mode, "pairs")) {
			size_t p = splitmix(&x) % (pages / 2) * 2;
			touch(p, want);
			touch(p + 1, want);
		} else {
			touch((size_t)t % pages, want);
		}
	}
	/* Every page once more, in a random order (a permutation by multiplying with an odd
	 * number modulo a power of two, skipping the indices past the end). */
	size_t span = 1;
	while (span < pages)
		span <<= 1;
	size_t mul = (splitmix(&x) | 1) & (span - 1);
	for (size_t i = 0; i < span; i++) {
		size_t page = (i * mul + 12345) & (span - 1);
		if (page < pages)
			check(page, want);
	}
	printf("readahead: %s, %zu pages, %ld touches, %zu bad pages\n", mode, pages, touches,
	       bad);
	return bad ? 1 : 0;
}
