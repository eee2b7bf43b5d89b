/* p4: fork of a process whose shared mapping is registered (UFFD_FEATURE_EVENT_FORK or not):
 * does the child's uffd get the shared vma's registration and the pte write-protection; and
 * how shared pages are counted (RssShmem per mapper, Pss_Shmem, Shmem system-wide), what
 * mincore and pagemap say for punched pages and for pages cached but unmapped in a process,
 * and what the daemon's open fd does to memory the program has unmapped. */
#include "common.h"

static const uint64_t FEAT = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_THREAD_ID |
			     UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
			     UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
static const uint64_t MODE = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;

static long rollup_kb(pid_t pid, const char *key)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/smaps_rollup", pid);
	FILE *f = fopen(path, "r");
	long v = -1;
	size_t kl = strlen(key);
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = atol(line + kl + 1);
			break;
		}
	if (f)
		fclose(f);
	return v;
}

static void fork_case(int event_fork)
{
	const char *lbl = event_fork ? "with UFFD_FEATURE_EVENT_FORK" : "without EVENT_FORK";
	say("\n== fork of P, MAP_SHARED|MAP_ANONYMOUS registered MISSING|WP, %s ==\n", lbl);
	start_workers(SHANON, 256, 0);
	struct worker *P = &g_w[0], *C = &g_w[1];
	int up = give_uffd(P, FEAT | (event_fork ? UFFD_FEATURE_EVENT_FORK : 0), MODE, NULL);
	g_log_faults = 0;
	for (int i = 0; i < 256; i++)
		call(P, OP_WRITE, i, 1000 + i, 0);
	g_log_faults = 1;
	g_hold_wp = 0;
	uffd_wp(up, g_region, 10 * PS, 1, 0); /* pages 0-9 write-protected in P */
	say("P: pages 0-9 write-protected; P forks C\n");
	struct reply r = call(P, OP_FORK, 0, 0, 0);
	C->pid = (pid_t)r.r;
	serve_for(50);
	char fl[256] = "?", flp[256] = "?";
	smaps_vmflags(P->pid, g_region, flp, sizeof flp);
	smaps_vmflags(C->pid, g_region, fl, sizeof fl);
	say("VmFlags P: %s\nVmFlags C: %s\n", flp, fl);
	say("pagemap page 0: P %s | C %s\n", pm_str(pagemap_entry(P->pid, g_region)),
	    pm_str(pagemap_entry(C->pid, g_region)));
	result("%s: the child's shared vma is %s (uffd flags um/uw in its VmFlags: %s); its pte of a "
	       "WP'd page: %s",
	       lbl, strstr(fl, "um") ? "registered" : "NOT registered",
	       strstr(fl, "um") ? "yes" : "no",
	       pagemap_entry(C->pid, g_region) & PM_UFFD_WP ? "write-protected (copied)"
							    : "not write-protected");
	long w0 = g_nfault_wp;
	send_cmd(C, OP_WRITE, 0, 7, 0);
	int t = wait_reply(C, &r, 300);
	result("%s: C writes page 0 (WP'd in P before the fork): %s", lbl,
	       t ? "held, unanswered"
		 : g_nfault_wp - w0 ? "trapped: a WP fault on the child's uffd, answered by D"
				    : "WENT THROUGH, no WP fault");
	if (t)
		wait_reply(C, &r, 2000);
	int fd = open_map_files(P->pid, g_region, NULL);
	if (pread(fd, g_store + 100 * PS, PS, 100 * PS) != PS)
		DIE("pread");
	g_stored[100] = 1;
	fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100 * PS, PS);
	long m0 = g_nfault_missing;
	r = call(C, OP_READ, 100, 0, 0);
	struct reply rp = call(P, OP_READ, 100, 0, 0);
	result("%s: C reads punched page 100: %ld MISSING fault(s) (uffd named above), C sees %" PRIu64
	       ", P sees %" PRIu64 " (expected 1100)%s",
	       lbl, g_nfault_missing - m0, r.val, rp.val,
	       rp.val != 1100 ? ": DATA LOSS, the unregistered child filled the hole" : "");
	close(fd);
	stop_workers();
	reap_all();
}

static void accounting(void)
{
	const int N = 8192; /* 32 MiB */
	say("\n== accounting: P and C map %d MiB of MAP_SHARED|MAP_ANONYMOUS ==\n", N / 256);
	start_workers(SHANON, N, 1);
	struct worker *P = &g_w[0], *C = &g_w[1];
	give_uffd(P, FEAT, MODE, NULL);
	give_uffd(C, FEAT, MODE, NULL);
	g_log_faults = 0;
	long sh0 = meminfo_kb("Shmem");
	for (int i = 0; i < N; i++) {
		call(P, OP_WRITE, i, i, 0);
		call(C, OP_READ, i, 0, 0);
	}
	system("sleep 1");
	long sh1 = meminfo_kb("Shmem");
	say("filled: Shmem +%ld kB | RssShmem P %ld C %ld | Pss_Shmem P %ld C %ld kB\n", sh1 - sh0,
	    rss_shmem_kb(P->pid), rss_shmem_kb(C->pid), rollup_kb(P->pid, "Pss_Shmem"),
	    rollup_kb(C->pid, "Pss_Shmem"));
	int fd = open_map_files(P->pid, g_region, NULL);
	fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, N / 2 * PS);
	system("sleep 1");
	long sh2 = meminfo_kb("Shmem");
	result("half punched: Shmem %+ld kB | RssShmem P %ld C %ld kB | Pss_Shmem P %ld C %ld kB "
	       "(RssShmem counts a shared page in every mapper; Pss_Shmem splits it; Shmem is the "
	       "system's, once)",
	       sh2 - sh1, rss_shmem_kb(P->pid), rss_shmem_kb(C->pid),
	       rollup_kb(P->pid, "Pss_Shmem"), rollup_kb(C->pid, "Pss_Shmem"));
	/* a page cached but not mapped in C */
	call(C, OP_MADVISE, N - 1, MADV_DONTNEED, 1);
	struct reply rc = call(C, OP_MINCORE, N - 1, 0, 0);
	struct reply rh = call(C, OP_MINCORE, 0, 0, 0);
	result("C, a page in the page cache but not in C's page table: mincore %lu, pagemap %s; a "
	       "punched page: mincore %lu, pagemap %s (mincore reports the page cache, pagemap the "
	       "process's pte; neither shows a punched page as swapped)",
	       (unsigned long)rc.val, pm_str(pagemap_entry(C->pid, g_region + (N - 1) * PS)),
	       (unsigned long)rh.val, pm_str(pagemap_entry(C->pid, g_region)));
	/* the daemon's fd keeps the inode after the program let go */
	call(C, OP_MADVISE, 0, MADV_DONTNEED, 0); /* no-op */
	long sh3 = meminfo_kb("Shmem");
	stop_workers(); /* P and C exit: their mappings are gone */
	reap_all();
	system("sleep 1");
	long sh4 = meminfo_kb("Shmem");
	close(fd);
	system("sleep 1");
	long sh5 = meminfo_kb("Shmem");
	result("P and C exited: Shmem %+ld kB while D still holds its map_files fd, %+ld kB after D "
	       "closes it (an fd held by the daemon keeps the program's shared memory alive)",
	       sh4 - sh3, sh5 - sh3);
}

int main(int argc, char **argv)
{
	probe_init(argc, argv);
	fork_case(1);
	fork_case(0);
	accounting();
	return 0;
}
