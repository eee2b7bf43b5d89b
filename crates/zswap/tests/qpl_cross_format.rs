//! QPL's raw deflate and miniz_oxide's raw deflate are one format: whatever one compresses the
//! other decompresses. Runs whenever libqpl is found (on every path it offers); without libqpl it
//! checks that loading fails with the clear error instead.

use miniz_oxide::deflate::compress_to_vec;
use miniz_oxide::inflate::decompress_to_vec;
use qpl_dyn::{ExecutionPath, Job, Qpl, QplError};

fn pages() -> Vec<Vec<u8>> {
    let mut out = vec![vec![0u8; 4096], vec![0xabu8; 4096]];
    let text: Vec<u8> = b"def load(self, entry):\n    return self.tree.pop(entry)\n"
        .iter()
        .copied()
        .cycle()
        .take(4096)
        .collect();
    out.push(text);
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut mixed = Vec::with_capacity(4096);
    for i in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        mixed.push(if i % 3 == 0 {
            (x >> 56) as u8
        } else {
            (i / 64) as u8
        });
    }
    out.push(mixed);
    out
}

#[test]
#[cfg_attr(
    miri,
    ignore = "libqpl is loaded with dlopen: miri cannot call foreign functions"
)]
fn qpl_and_software_deflate_interoperate() {
    let qpl = match Qpl::load() {
        Ok(q) => q,
        Err(e) => {
            assert!(
                matches!(e, QplError::LibraryNotFound { .. }),
                "unexpected error: {e}"
            );
            assert!(e.to_string().contains("libqpl"));
            eprintln!("SKIPPED cross-format check: {e}");
            return;
        }
    };
    let mut jobs = vec![Job::new(&qpl, ExecutionPath::Software).expect("software path job")];
    if let Ok(hw) = Job::new(&qpl, ExecutionPath::Hardware) {
        jobs.push(hw);
    }
    for job in &mut jobs {
        for page in pages() {
            // QPL -> software.
            let mut packed = vec![0u8; 2 * page.len() + 64];
            let n = job.compress(&page, &mut packed).expect("qpl compress");
            let back = decompress_to_vec(&packed[..n]).expect("miniz inflates qpl output");
            assert_eq!(back, page, "path {:?}", job.path());
            // Software -> QPL.
            let soft = compress_to_vec(&page, 6);
            let mut out = vec![0u8; page.len()];
            let m = job
                .decompress(&soft, &mut out)
                .expect("qpl inflates miniz output");
            assert_eq!(m, page.len());
            assert_eq!(out, page, "path {:?}", job.path());
        }
    }
}

/// The same through the store's codecs: deflate-iaa output loads with software deflate and back.
#[test]
#[cfg_attr(
    miri,
    ignore = "libqpl is loaded with dlopen: miri cannot call foreign functions"
)]
fn deflate_iaa_codec_matches_software_deflate() {
    use zswap::{Compressor, PageCodec};
    let mut iaa = match PageCodec::new(Compressor::DeflateIaa) {
        Ok(c) => c,
        Err(e) => {
            assert!(e.to_string().contains("libqpl"), "{e}");
            eprintln!("SKIPPED deflate-iaa codec check: {e}");
            return;
        }
    };
    let mut soft = PageCodec::new(Compressor::Deflate { level: 6 }).expect("software deflate");
    for page in pages() {
        let mut buf = vec![0u8; 3 * 4096];
        let n = iaa.compress(&page, &mut buf).expect("iaa compress");
        let mut out = vec![0u8; 4096];
        soft.decompress(&buf[..n], &mut out)
            .expect("software inflates iaa output");
        assert_eq!(out, page);
        let m = soft.compress(&page, &mut buf).expect("software compress");
        iaa.decompress(&buf[..m], &mut out)
            .expect("iaa inflates software output");
        assert_eq!(out, page);
    }
}
