//! Runs the whole QPL path (qpl-dyn's loading, job set-up and execution, zswap's deflate-iaa
//! compressor) against a stand-in libqpl built at test time from C with zlib: it has QPL 1.x's
//! job API and `qpl_job` header, refuses the hardware path (no IAA device, as on most machines)
//! and does raw deflate in software. Real libqpl is not installed here; this checks everything
//! on our side of the ABI. Skips, saying why, when gcc or zlib's header is missing.

use miniz_oxide::deflate::compress_to_vec;
use miniz_oxide::inflate::decompress_to_vec;
use qpl_dyn::{ExecutionPath, Job, Qpl, QplError};
use zswap::{Compressor, Config, PageCodec, Zswap, PAGE_SIZE};

const MOCK: &str = r#"
#include <stdint.h>
#include <string.h>
#include <zlib.h>
typedef struct {
    uint8_t *next_in_ptr; uint32_t available_in; uint32_t total_in;
    uint8_t *next_out_ptr; uint32_t available_out; uint32_t total_out;
    uint32_t op; uint32_t flags; uint32_t crc; uint32_t xor_checksum;
    uint32_t last_bit_offset; uint32_t level;
} head;
#define JOB_SIZE 4096
uint32_t qpl_get_job_size(uint32_t path, uint32_t *size) {
    if (path > 2) return 1;
    *size = JOB_SIZE;
    return 0;
}
uint32_t qpl_init_job(uint32_t path, uint8_t *job) {
    if (path == 1) return 57; /* hardware path: no IAA device */
    memset(job, 0, JOB_SIZE);
    job[JOB_SIZE - 1] = 0xa5;
    return 0;
}
uint32_t qpl_execute_job(uint8_t *job) {
    head *h = (head *)job;
    if (job[JOB_SIZE - 1] != 0xa5) return 99;
    if ((h->flags & 3) != 3) return 98; /* FIRST | LAST */
    z_stream s;
    memset(&s, 0, sizeof s);
    s.next_in = h->next_in_ptr; s.avail_in = h->available_in;
    s.next_out = h->next_out_ptr; s.avail_out = h->available_out;
    int rc;
    if (h->op == 1) {
        if (deflateInit2(&s, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 97;
        rc = deflate(&s, Z_FINISH);
        deflateEnd(&s);
        if (rc != Z_STREAM_END) return 2; /* QPL_STS_MORE_OUTPUT_NEEDED */
    } else if (h->op == 0) {
        if (inflateInit2(&s, -15) != Z_OK) return 97;
        rc = inflate(&s, Z_FINISH);
        inflateEnd(&s);
        if (rc == Z_BUF_ERROR && s.avail_out == 0) return 2;
        if (rc != Z_STREAM_END) return 3;
    } else {
        return 96;
    }
    h->total_in = (uint32_t)s.total_in;
    h->total_out = (uint32_t)s.total_out;
    return 0;
}
uint32_t qpl_fini_job(uint8_t *job) {
    job[JOB_SIZE - 1] = 0;
    return 0;
}
"#;

fn build_mock() -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("zswap-qpl-mock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("mock_qpl.c");
    let lib = dir.join("libqpl_mock.so");
    std::fs::write(&src, MOCK).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-lz")
        .output()
        .map_err(|e| format!("gcc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "gcc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(lib)
}

fn pages() -> Vec<Vec<u8>> {
    let text: Vec<u8> = b"while True: entry = tree.pop(key) or backend.read(slot)\n"
        .iter()
        .copied()
        .cycle()
        .take(PAGE_SIZE)
        .collect();
    let mixed: Vec<u8> = (0..PAGE_SIZE)
        .map(|i| ((i * 7919) >> 5) as u8 ^ (i % 13) as u8)
        .collect();
    vec![vec![0u8; PAGE_SIZE], text, mixed]
}

#[test]
#[cfg_attr(
    miri,
    ignore = "libqpl is loaded with dlopen: miri cannot call foreign functions (and the test builds a stand-in library with the C compiler)"
)]
fn qpl_path_end_to_end_against_a_stand_in_library() {
    let lib = match build_mock() {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("SKIPPED: cannot build the stand-in libqpl: {e}");
            return;
        }
    };
    let path = lib.to_string_lossy().into_owned();
    let qpl = Qpl::load_from(&path).expect("load the stand-in");
    // No IAA device: the hardware path fails with QPL's status, new_best falls back.
    match Job::new(&qpl, ExecutionPath::Hardware) {
        Err(QplError::Status {
            call: "qpl_init_job",
            status: 57,
            ..
        }) => {}
        other => panic!("hardware path: {other:?}"),
    }
    let mut job = Job::new_best(&qpl).expect("software path");
    assert_eq!(job.path(), ExecutionPath::Software);
    for page in pages() {
        let mut packed = vec![0u8; 2 * PAGE_SIZE];
        let n = job.compress(&page, &mut packed).expect("compress");
        assert_eq!(
            decompress_to_vec(&packed[..n]).expect("miniz inflates it"),
            page
        );
        let soft = compress_to_vec(&page, 6);
        let mut out = vec![0u8; PAGE_SIZE];
        assert_eq!(
            job.decompress(&soft, &mut out)
                .expect("inflate miniz output"),
            PAGE_SIZE
        );
        assert_eq!(out, page);
        let mut small = vec![0u8; 8];
        assert!(matches!(
            job.decompress(&soft, &mut small),
            Err(QplError::OutputTooSmall { .. })
        ));
    }
    assert!(
        job.decompress(b"\xff\xff\xff\xff", &mut [0u8; 64]).is_err(),
        "garbage is an error"
    );

    // The store's deflate-iaa compressor picks the library up from QPL_LIBRARY.
    std::env::set_var(qpl_dyn::LIBRARY_ENV, &path);
    let mut iaa = PageCodec::new(Compressor::DeflateIaa).expect("deflate-iaa codec");
    assert_eq!(iaa.qpl_path(), Some(ExecutionPath::Software));
    let mut soft = PageCodec::new(Compressor::Deflate { level: 6 }).expect("deflate");
    for page in pages() {
        let mut buf = vec![0u8; 3 * PAGE_SIZE];
        let n = iaa.compress(&page, &mut buf).expect("iaa compress");
        let mut out = vec![0u8; PAGE_SIZE];
        soft.decompress(&buf[..n], &mut out)
            .expect("software inflates iaa output");
        assert_eq!(out, page);
    }
    let zswap = Zswap::new(Config::new(Compressor::DeflateIaa)).expect("deflate-iaa store");
    let folio: Vec<u8> = pages()
        .concat()
        .into_iter()
        .chain(pages()[1].clone())
        .collect();
    zswap.store(64, &folio).expect("store 4 pages");
    let mut out = vec![0u8; folio.len()];
    zswap.load(64, &mut out).expect("load");
    assert_eq!(out, folio);
    let _ = std::fs::remove_dir_all(lib.parent().unwrap_or(&lib));
}
