/* p3: the race between D's read of a shared page and its punch, and whether userfaultfd
 * write-protection closes it.
 *   A  no write-protection: writers in P and C (atomic +1 on one word) while D evicts the page
 *      over and over (pread, a short window, punch, serve the MISSING faults from the copy):
 *      updates made in the window are lost.
 *   B  the page write-protected (UFFDIO_WRITEPROTECT) through EVERY mapper's uffd before the
 *      read, writers woken after the punch: none lost.
 *   C  write-protection in P only (C registered MISSING only): C's writes go through.
 *   D  which writes a WP'd shmem page does and does not stop: a write in P; a write in C whose
 *      pte was empty (a pte marker); pwrite on the map_files fd; process_vm_writev; a write
 *      to /proc/P/mem. pte markers across a punch (pagemap bit 57). */
#include "common.h"

static uint64_t FEAT_M = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_THREAD_ID;
static uint64_t FEAT_WP = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_THREAD_ID |
			  UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
			  UFFD_FEATURE_WP_UNPOPULATED;
static const uint64_t MODE_M = UFFDIO_REGISTER_MODE_MISSING;
static const uint64_t MODE_MWP = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;

/* wp_in: bit 0 P, bit 1 C: whose uffd D write-protects through */
static void race(enum backing b, const char *label, int wp_reg, int wp_in, int rounds,
		 int window_us, int threads)
{
	start_workers(b, 4, 1);
	struct worker *P = &g_w[0], *C = &g_w[1];
	uint64_t gp = 0, gc = 0;
	int up = give_uffd(P, wp_reg & 1 ? FEAT_WP : FEAT_M, wp_reg & 1 ? MODE_MWP : MODE_M, &gp);
	int uc = give_uffd(C, wp_reg & 2 ? FEAT_WP : FEAT_M, wp_reg & 2 ? MODE_MWP : MODE_M, &gc);
	if (up < 0 || uc < 0)
		DIE("register: %s", strerror(-(up < 0 ? up : uc)));
	int fd = open_map_files(P->pid, g_region, NULL);
	g_log_faults = 0;
	call(P, OP_WRITE, 0, 0, 0);
	call(C, OP_READ, 0, 0, 0);
	call(P, OP_HAMMER, 0, 0, threads);
	call(C, OP_HAMMER, 0, 0, threads);
	g_hold_wp = 2;
	long wpf0 = g_nfault_wp, mf0 = g_nfault_missing;
	long waited = 0;
	for (int i = 0; i < rounds; i++) {
		serve_for(1); /* let the writers run and fault the page back */
		/* evict only a resident page, as the daemon does (a hole read back gives zeros) */
		if (lseek(fd, 0, SEEK_DATA) != 0) {
			waited++;
			i--;
			continue;
		}
		g_evicting[0] = 1;
		if (wp_in & 1)
			uffd_wp(up, g_region, PS, 1, 0);
		if (wp_in & 2)
			uffd_wp(uc, g_region, PS, 1, 0);
		if (pread(fd, g_store, PS, 0) != PS)
			DIE("pread");
		g_stored[0] = 1;
		if (window_us) {
			double end = now_ms() + window_us / 1000.0;
			while (now_ms() < end)
				;
		}
		if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, PS))
			DIE("punch");
		g_evicting[0] = 0;
		/* writers held in a WP fault retry now and fault MISSING on the hole */
		uffd_wake(up, g_region, PS);
		uffd_wake(uc, g_region, PS);
	}
	struct reply rp = call(P, OP_HAMMER_STOP, 0, 0, 0);
	struct reply rc = call(C, OP_HAMMER_STOP, 0, 0, 0);
	struct reply rv = call(P, OP_READ, 0, 0, 0);
	g_hold_wp = 0;
	uint64_t sum = rp.val + rc.val;
	result("%s, %s: %d evictions of a page 2x%d threads add to (window %d us): %" PRIu64
	       " adds, final value %" PRIu64 ", LOST %" PRId64 "; %ld WP faults held, %ld MISSING "
	       "faults served",
	       backing_name[b], label, rounds, threads, window_us, sum, rv.val,
	       (int64_t)(sum - rv.val), g_nfault_wp - wpf0, g_nfault_missing - mf0);
	g_log_faults = 1;
	close(fd);
	stop_workers();
	reap_all();
}

struct pvw_arg {
	pid_t pid;
	void *addr;
	int done;
	long ret;
	int err;
	int mem; /* 1: /proc/PID/mem, 0: process_vm_writev */
};
static void *pvw_fn(void *a)
{
	struct pvw_arg *x = a;
	uint64_t v = 0x77;
	if (x->mem) {
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/mem", x->pid);
		int fd = open(path, O_RDWR);
		x->ret = pwrite(fd, &v, 8, (off_t)(uintptr_t)x->addr);
		x->err = errno;
		close(fd);
	} else {
		struct iovec l = {&v, 8}, r = {x->addr, 8};
		x->ret = process_vm_writev(x->pid, &l, 1, &r, 1, 0);
		x->err = errno;
	}
	__atomic_store_n(&x->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void bypass(enum backing b)
{
	say("\n== %s: what a write-protected shmem page stops ==\n", backing_name[b]);
	start_workers(b, 8, 1);
	struct worker *P = &g_w[0], *C = &g_w[1];
	uint64_t gp;
	int up = give_uffd(P, FEAT_WP, MODE_MWP, &gp);
	int uc = give_uffd(C, FEAT_WP, MODE_MWP, NULL);
	say("features granted: %#" PRIx64 " (WP_HUGETLBFS_SHMEM %s, WP_UNPOPULATED %s)\n", gp,
	    gp & UFFD_FEATURE_WP_HUGETLBFS_SHMEM ? "yes" : "no",
	    gp & UFFD_FEATURE_WP_UNPOPULATED ? "yes" : "no");
	int fd = open_map_files(P->pid, g_region, NULL);
	g_log_faults = 0;
	for (int i = 0; i < 8; i++)
		call(P, OP_WRITE, i, 100 + i, 0);
	call(C, OP_READ, 1, 0, 0);
	call(C, OP_MADVISE, 2, MADV_DONTNEED, 1); /* C's pte of page 2: none */
	g_log_faults = 1;
	/* WP pages 1..5 in both */
	g_hold_wp = 2;
	for (int i = 1; i <= 5; i++)
		g_evicting[i] = 1;
	uffd_wp(up, g_region + PS, 5 * PS, 1, 0);
	uffd_wp(uc, g_region + PS, 5 * PS, 1, 0);
	say("pagemap page 2 after WP: P %s | C %s (C's pte was empty)\n",
	    pm_str(pagemap_entry(P->pid, g_region + 2 * PS)),
	    pm_str(pagemap_entry(C->pid, g_region + 2 * PS)));

	struct reply r;
	/* 1: write in P */
	send_cmd(P, OP_WRITE, 1, 0xdead, 0);
	int t = wait_reply(P, &r, 300);
	result("%s: P writes WP'd page 1: %s", backing_name[b],
	       t ? "held in a WP fault (300 ms, no answer)" : "WENT THROUGH");
	/* 2: write in C where C's pte was empty */
	send_cmd(C, OP_WRITE, 2, 0xbeef, 0);
	int t2 = wait_reply(C, &r, 300);
	result("%s: C writes WP'd page 2 whose pte in C was empty: %s", backing_name[b],
	       t2 ? "held in a WP fault (the pte marker)" : "WENT THROUGH");
	/* 3: pwrite on the fd */
	uint64_t v = 0x5555, cur = 0;
	ssize_t n = pwrite(fd, &v, 8, 3 * PS);
	pread(fd, &cur, 8, 3 * PS);
	result("%s: pwrite(map_files fd) into WP'd page 3 -> %zd, page now %#" PRIx64 ": %s",
	       backing_name[b], n, cur, cur == v ? "BYPASSES write-protection" : "stopped");
	/* 4: process_vm_writev, 5: /proc/P/mem */
	for (int mem = 0; mem < 2; mem++) {
		struct pvw_arg x = {.pid = P->pid, .addr = g_region + (4 + mem) * PS, .mem = mem};
		pthread_t th;
		long wp0 = g_nfault_wp;
		pthread_create(&th, NULL, pvw_fn, &x);
		serve_for(300);
		int done = __atomic_load_n(&x.done, __ATOMIC_SEQ_CST);
		uint64_t before = 0;
		pread(fd, &before, 8, (4 + mem) * PS);
		result("%s: %s into WP'd page %d: %s after 300 ms (%ld WP fault(s) raised on P's "
		       "uffd; page holds %#" PRIx64 ")%s",
		       backing_name[b], mem ? "pwrite(/proc/P/mem)" : "process_vm_writev", 4 + mem,
		       done ? "finished" : "still blocked", g_nfault_wp - wp0, before,
		       done ? "" : "; un-WP'ing it now");
		if (!done) {
			g_evicting[4 + mem] = 0;
			uffd_wp(up, g_region + (4 + mem) * PS, PS, 0, 0);
			serve_for(100);
		}
		pthread_join(th, NULL);
		say("  -> returned %ld (%s)\n", x.ret, x.ret < 0 ? strerror(x.err) : "ok");
	}
	/* punch 1..3 while WP'd; markers? */
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, PS, 3 * PS))
		DIE("punch");
	result("%s: after punching WP'd pages 1-3: pagemap page 1: P %s | C %s (the uffd-wp bit "
	       "survives the punch as a pte marker)",
	       backing_name[b], pm_str(pagemap_entry(P->pid, g_region + PS)),
	       pm_str(pagemap_entry(C->pid, g_region + PS)));
	for (int i = 1; i <= 3; i++)
		g_evicting[i] = 0;
	memset(g_stored, 0, g_npages);
	uffd_wake(up, g_region + PS, 3 * PS);
	uffd_wake(uc, g_region + PS, 3 * PS);
	/* the held writers retry: MISSING (zeros served: no copy stored) */
	wait_reply(P, &r, 2000);
	wait_reply(C, &r, 2000);
	say("  (the held writes of P and C finished after the wake)\n");
	long m0 = g_nfault_missing, w0 = g_nfault_wp;
	call(C, OP_READ, 3, 0, 0);
	say("  C read of punched page 3 -> %ld MISSING; C pagemap page 3 now %s\n",
	    g_nfault_missing - m0, pm_str(pagemap_entry(C->pid, g_region + 3 * PS)));
	call(P, OP_READ, 3, 0, 0);
	say("  P read of page 3 (in the page cache now, P's pte a marker) -> pagemap %s\n",
	    pm_str(pagemap_entry(P->pid, g_region + 3 * PS)));
	call(P, OP_WRITE, 3, 1, 0);
	result("%s: a punched WP'd page refaults MISSING (%ld) in the reader; the other mapper's "
	       "marker maps the restored page write-protected: its write raised %ld WP fault(s)",
	       backing_name[b], g_nfault_missing - m0, g_nfault_wp - w0);
	g_hold_wp = 0;
	close(fd);
	stop_workers();
	reap_all();
}

int main(int argc, char **argv)
{
	probe_init(argc, argv);
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	int only_race = argc > 2 && !strcmp(argv[2], "race");
	for (int b = 0; b < NBACKING; b++) {
		if (only_race && b != SHANON)
			continue;
		say("\n== %s: the read-punch race ==\n", backing_name[b]);
		race(b, "A no WP", 0, 0, rounds, 50, 2);
		race(b, "B WP through P's and C's uffds", 3, 3, rounds, 50, 2);
		race(b, "C WP through P's uffd only", 1, 1, rounds, 50, 2);
		if (!only_race)
			bypass(b);
	}
	return 0;
}
