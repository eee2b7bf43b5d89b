/* p1: MISSING and MINOR userfaults on shared memory shared by a parent P and its fork child C.
 * Which process's uffd gets the fault, whether UFFDIO_COPY through one process's uffd is seen
 * by the other (the page cache), what a mapper without a registration does to a hole, EEXIST,
 * ZEROPAGE, MOVE, MADV_REMOVE and MADV_DONTNEED, and what MINOR + UFFDIO_CONTINUE offer.
 * Run for the three kinds of shared memory: MAP_SHARED|MAP_ANONYMOUS, /dev/zero, memfd. */
#include "common.h"

static const uint64_t FEAT = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_THREAD_ID |
			     UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;

static void part_missing(enum backing b)
{
	say("\n== %s: MISSING registration, P and C share the region by fork ==\n",
	    backing_name[b]);
	start_workers(b, 16, 1);
	struct worker *P = &g_w[0], *C = &g_w[1];
	uint64_t granted;
	int up = give_uffd(P, FEAT | UFFD_FEATURE_MOVE, UFFDIO_REGISTER_MODE_MISSING, &granted);
	if (up < 0) {
		result("%s: P cannot register MISSING: %s", backing_name[b], strerror(-up));
		stop_workers();
		return;
	}
	say("P registered MISSING (features granted %#" PRIx64 ")\n", granted);

	/* A: C has no registration yet. */
	long m0 = g_nfault_missing;
	struct reply r = call(C, OP_READ, 1, 0, 0);
	long m1 = g_nfault_missing;
	r = call(P, OP_READ, 1, 0, 0);
	long m2 = g_nfault_missing;
	result("%s: C (not registered) read a hole (page 1): %ld faults; P (registered) then read "
	       "it: %ld faults (the unregistered mapper filled the hole in the page cache, "
	       "silently)",
	       backing_name[b], m1 - m0, m2 - m1);

	int uc = give_uffd(C, FEAT, UFFDIO_REGISTER_MODE_MISSING, NULL);
	say("C registered MISSING too (uffd %d in D)\n", uc);

	/* B: C faults on page 2; D answers through C's uffd with a stored page. */
	memset(g_store + 2 * PS, 0xC2, PS);
	g_stored[2] = 1;
	m0 = g_nfault_missing;
	r = call(C, OP_CHECKFILL, 2, 0xC2, 0);
	m1 = g_nfault_missing;
	struct reply rp = call(P, OP_CHECKFILL, 2, 0xC2, 0);
	m2 = g_nfault_missing;
	result("%s: C's read of hole page 2 -> %ld MISSING fault(s) on C's uffd, served by "
	       "UFFDIO_COPY through C's uffd (C sees %ld wrong bytes); P then reads it with %ld "
	       "fault(s), %ld wrong bytes: one COPY fills the page for every mapper",
	       backing_name[b], m1 - m0, (long)r.r, m2 - m1, (long)rp.r);

	/* COPY through P's uffd with no fault pending; C reads. */
	unsigned char buf[PS];
	memset(buf, 0x33, PS);
	int e = uffd_copy(up, g_region + 3 * PS, buf, PS, 0);
	m0 = g_nfault_missing;
	r = call(C, OP_CHECKFILL, 3, 0x33, 0);
	m1 = g_nfault_missing;
	result("%s: UFFDIO_COPY of page 3 through P's uffd, no fault pending -> %s; C reads it "
	       "with %ld faults, %ld wrong bytes",
	       backing_name[b], e ? strerror(-e) : "ok", m1 - m0, (long)r.r);
	e = uffd_copy(uc, g_region + 3 * PS, buf, PS, 0);
	result("%s: UFFDIO_COPY of page 3 again, through C's uffd -> %s (the page is in the page "
	       "cache: a second mapper's COPY must treat EEXIST as done and UFFDIO_WAKE)",
	       backing_name[b], e ? strerror(-e) : "ok");

	/* ZEROPAGE on shmem */
	struct uffdio_zeropage z = {.range = {(uintptr_t)(g_region + 4 * PS), PS}};
	e = ioctl(up, UFFDIO_ZEROPAGE, &z) ? -errno : 0;
	m0 = g_nfault_missing;
	r = call(C, OP_CHECKFILL, 4, 0, 0);
	m1 = g_nfault_missing;
	result("%s: UFFDIO_ZEROPAGE on page 4 through P's uffd -> %s; C then reads it with %ld "
	       "faults, %ld non-zero bytes",
	       backing_name[b], e ? strerror(-e) : "ok", m1 - m0, (long)r.r);

	/* MOVE between two shmem pages of P */
	call(P, OP_FILL, 5, 0x55, 0);
	struct uffdio_move_ mv = {.dst = (uintptr_t)(g_region + 6 * PS),
				  .src = (uintptr_t)(g_region + 5 * PS), .len = PS};
	e = ioctl(up, UFFDIO_MOVE_, &mv) ? -errno : 0;
	result("%s: UFFDIO_MOVE of a shmem page (P's page 5 -> 6) -> %s (granted MOVE: %s)",
	       backing_name[b], e ? strerror(-e) : "ok",
	       granted & UFFD_FEATURE_MOVE ? "yes" : "no");

	/* MADV_DONTNEED in P: zaps P's pte only */
	r = call(P, OP_MADVISE, 3, MADV_DONTNEED, 1);
	m0 = g_nfault_missing;
	rp = call(P, OP_CHECKFILL, 3, 0x33, 0);
	m1 = g_nfault_missing;
	result("%s: MADV_DONTNEED of page 3 in P -> %s; P reads it back with %ld MISSING faults and "
	       "%ld wrong bytes (DONTNEED on shared memory only unmaps: the page stays in the page "
	       "cache)",
	       backing_name[b], r.r ? strerror((int)-r.r) : "ok", m1 - m0, (long)rp.r);

	/* MADV_REMOVE in P: punches the page out of the page cache for every mapper */
	r = call(P, OP_MADVISE, 2, MADV_REMOVE, 1);
	serve_for(50);
	g_stored[2] = 0;
	m0 = g_nfault_missing;
	rp = call(C, OP_CHECKFILL, 2, 0, 0);
	m1 = g_nfault_missing;
	result("%s: MADV_REMOVE of page 2 in P -> %s (events above); C's next read of page 2 -> "
	       "%ld MISSING fault(s) on C's uffd (%ld non-zero bytes after a zero fill)",
	       backing_name[b], r.r ? strerror((int)-r.r) : "ok", m1 - m0, (long)rp.r);
	stop_workers();
	reap_all();
}

static void part_minor(enum backing b)
{
	say("\n== %s: MISSING|MINOR registration in P and C ==\n", backing_name[b]);
	start_workers(b, 16, 1);
	struct worker *P = &g_w[0], *C = &g_w[1];
	uint64_t f = FEAT | UFFD_FEATURE_MINOR_SHMEM;
	int up = give_uffd(P, f, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR, NULL);
	int uc = give_uffd(C, f, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR, NULL);
	if (up < 0 || uc < 0) {
		result("%s: MINOR registration refused: %s", backing_name[b],
		       strerror(-(up < 0 ? up : uc)));
		stop_workers();
		return;
	}
	long m0 = g_nfault_missing, n0 = g_nfault_minor;
	call(C, OP_WRITE, 0, 0xabc, 0);
	long m1 = g_nfault_missing, n1 = g_nfault_minor;
	struct reply r = call(P, OP_READ, 0, 0, 0);
	long m2 = g_nfault_missing, n2 = g_nfault_minor;
	result("%s: C writes hole page 0: %ld MISSING/%ld MINOR; P reads it (in the page cache, "
	       "not in P's page table): %ld MISSING/%ld MINOR, CONTINUE maps it, P sees %#" PRIx64,
	       backing_name[b], m1 - m0, n1 - n0, m2 - m1, n2 - n1, r.val);
	call(P, OP_MADVISE, 0, MADV_DONTNEED, 1);
	n0 = g_nfault_minor;
	r = call(P, OP_READ, 0, 0, 0);
	n1 = g_nfault_minor;
	result("%s: after MADV_DONTNEED of page 0 in P, P's next read -> %ld MINOR fault(s), value "
	       "%#" PRIx64 " (zap + MINOR = a per-process access bit for a shared page)",
	       backing_name[b], n1 - n0, r.val);
	int e = uffd_continue(up, g_region + 7 * PS, PS);
	result("%s: UFFDIO_CONTINUE on a hole (page 7) -> %s (CONTINUE only maps a page already "
	       "in the page cache; it cannot fill one)",
	       backing_name[b], e ? strerror(-e) : "ok");
	stop_workers();
	reap_all();

	say("\n== %s: MINOR-only registration in P ==\n", backing_name[b]);
	start_workers(b, 16, 0);
	P = &g_w[0];
	up = give_uffd(P, f, UFFDIO_REGISTER_MODE_MINOR, NULL);
	m0 = g_nfault_missing;
	n0 = g_nfault_minor;
	r = call(P, OP_READ, 1, 0, 0);
	result("%s: MINOR-only: P reads a hole -> %ld MISSING/%ld MINOR faults (a hole is filled "
	       "with zeros by the kernel: MINOR alone cannot serve evicted pages)",
	       backing_name[b], g_nfault_missing - m0, g_nfault_minor - n0);
	stop_workers();
	reap_all();
}

int main(int argc, char **argv)
{
	probe_init(argc, argv);
	say("kernel: ");
	fflush(stdout);
	system("uname -r");
	for (int b = 0; b < NBACKING; b++) {
		part_missing(b);
		part_minor(b);
	}
	return 0;
}
