//! The fused CUDA kernels (`src/cuda/fused.cu`) run on the host against the CPU kernels, without
//! a GPU.
//!
//! Every fused kernel gives each thread whole rows and lets no thread wait on another, so running
//! a launch's threads one after another computes exactly what the device computes. The test
//! compiles the generated definitions (`ops::cuda_defines`), `prelude.cu` and `fused.cu` as C++
//! with a small shim (the launch's block and thread indices as globals, the CUDA bit-cast
//! intrinsics) and a driver that reads a problem, runs the kernels for every block and thread
//! of a launch in turn, and writes the results; the same
//! problem goes through `cpu::norm` and `cpu::attention`, and the two must agree (f64 within
//! 1e-12 relative, f32 within 1e-5: the f32 exponentials differ by an ulp or so). Each problem
//! runs under two launch shapes (one thread; 2 blocks of 3 threads) to check the grid-stride
//! indexing.
//!
//! Needs a C++ compiler (`c++`, or `CXX`); without one the test reports the skip and passes, unless
//! `ARENAGRAD_REQUIRE_CXX=1` (CI).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use arenagrad_exec::cpu::attention::{self, AttnDims, AttnMask};
use arenagrad_exec::cpu::{dropout, norm};
use arenagrad_exec::testing::{skip_or_fail, REQUIRE_CXX};
use arenagrad_exec::Float;

const SHIM: &str = r#"
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
struct Dim3 { unsigned long long x; };
static Dim3 blockIdx, threadIdx, blockDim, gridDim;
static inline float __int_as_float(unsigned int v) { float f; memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(unsigned long long v) { double d; memcpy(&d, &v, 8); return d; }
"#;

const DRIVER: &str = r#"
// Runs `f` once for every (block, thread) of a launch of `grid` blocks of `block` threads.
template <typename F> static void launch(u64 grid, u64 block, F f) {
    gridDim.x = grid;
    blockDim.x = block;
    for (u64 b = 0; b < grid; ++b)
        for (u64 t = 0; t < block; ++t) {
            blockIdx.x = b;
            threadIdx.x = t;
            f();
        }
}

struct Input {
    std::vector<double> v;
    size_t at = 0;
    double next() { return v.at(at++); }
    u64 u() { return (u64)next(); }
    u64 u64_() { u64 hi = u(); return (hi << 32) | u(); }
    template <typename T> std::vector<T> arr(size_t n) {
        std::vector<T> out(n);
        for (size_t i = 0; i < n; ++i) out[i] = (T)next();
        return out;
    }
};

static std::vector<double> out;
template <typename T> static void put(const std::vector<T>& a) {
    for (auto x : a) out.push_back((double)x);
}
#define P(a) ((u64)(a).data())

template <typename T> static void norm_case(Input& in, u64 grid, u64 block) {
    u64 rows = in.u(), n = in.u();
    double eps = in.next();
    u64 rms = in.u(), has_w = in.u(), has_b = in.u();
    auto x = in.arr<T>(rows * n);
    auto w = in.arr<T>(has_w ? n : 0);
    auto b = in.arr<T>(has_b ? n : 0);
    auto gy = in.arr<T>(rows * n);
    std::vector<T> st(2 * rows), y(rows * n), dx(rows * n), dw(n), db(n);
    bool f64 = sizeof(T) == 8;
    launch(grid, block, [&] { (f64 ? norm_stats_f64 : norm_stats_f32)(P(x), rows, n, eps, rms, P(st)); });
    launch(grid, block, [&] {
        (f64 ? norm_apply_f64 : norm_apply_f32)(P(x), rows, n, P(st), P(w), P(b), has_w, has_b, P(y));
    });
    launch(grid, block, [&] {
        (f64 ? norm_grad_input_f64 : norm_grad_input_f32)(P(x), P(gy), P(st), rows, n, P(w), has_w, rms, P(dx));
    });
    launch(grid, block, [&] {
        (f64 ? norm_grad_params_f64 : norm_grad_params_f32)(P(x), P(gy), P(st), rows, n, has_w, has_b, P(dw), P(db));
    });
    put(st); put(y); put(dx); put(dw); put(db);
}

template <typename T> static void attn_case(Input& in, u64 grid, u64 block) {
    AttnParams p = {};
    p.bh = in.u(); p.lq = in.u(); p.lk = in.u(); p.d = in.u(); p.dv = in.u();
    p.causal = in.u(); p.has_mask = in.u(); p.dropout = in.u();
    p.seed = in.u64_(); p.threshold = in.u64_();
    p.scale = in.next(); p.keep_scale = in.next();
    p.mask_rs = (i64)in.u(); p.mask_cs = (i64)in.u(); p.lead_rank = (i64)in.u();
    for (i64 a = 0; a < p.lead_rank; ++a) p.lead_shape[a] = (i64)in.u();
    for (i64 a = 0; a < p.lead_rank; ++a) p.lead_stride[a] = (i64)in.u();
    u64 mask_len = in.u();
    auto q = in.arr<T>(p.bh * p.lq * p.d);
    auto k = in.arr<T>(p.bh * p.lk * p.d);
    auto v = in.arr<T>(p.bh * p.lk * p.dv);
    auto mask = in.arr<T>(mask_len);
    auto go = in.arr<T>(p.bh * p.lq * p.dv);
    std::vector<T> o(p.bh * p.lq * p.dv), lse(p.bh * p.lq), delta(p.bh * p.lq);
    std::vector<T> dq(p.bh * p.lq * p.d), dk(p.bh * p.lk * p.d), dv(p.bh * p.lk * p.dv);
    bool f64 = sizeof(T) == 8;
    launch(grid, block, [&] { (f64 ? attn_forward_f64 : attn_forward_f32)(P(q), P(k), P(v), P(mask), p, P(o), P(lse)); });
    launch(grid, block, [&] { (f64 ? attn_delta_f64 : attn_delta_f32)(P(go), P(o), p, P(delta)); });
    launch(grid, block, [&] {
        (f64 ? attn_dq_f64 : attn_dq_f32)(P(q), P(k), P(v), P(mask), P(go), P(lse), P(delta), p, P(dq));
    });
    launch(grid, block, [&] {
        (f64 ? attn_dkdv_f64 : attn_dkdv_f32)(P(q), P(k), P(v), P(mask), P(go), P(lse), P(delta), p, P(dk), P(dv));
    });
    put(o); put(lse); put(dq); put(dk); put(dv);
}

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 3;
    Input in;
    double x;
    while (fread(&x, 8, 1, f) == 1) in.v.push_back(x);
    fclose(f);
    u64 kind = in.u(), f64 = in.u(), grid = in.u(), block = in.u();
    if (kind == 1) f64 ? norm_case<double>(in, grid, block) : norm_case<float>(in, grid, block);
    else if (kind == 2) f64 ? attn_case<double>(in, grid, block) : attn_case<float>(in, grid, block);
    else return 4;
    FILE* o = fopen(argv[2], "wb");
    if (!o) return 5;
    fwrite(out.data(), 8, out.size(), o);
    fclose(o);
    return 0;
}
"#;

/// The compiled driver, or why there is none (no C++ compiler).
fn driver() -> Option<&'static Path> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        // Under the target directory (cargo's scratch space for integration tests), where a
        // `cargo clean` removes it: a static is never dropped, so nothing would remove a
        // directory under /tmp.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("host-cuda-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let src = dir.join("driver.cpp");
        // The definitions the kernels take from Rust (`BLOCK`, `MAX_DIMS`, the op tables) come
        // first, as in the CUDA backend's own source.
        let defines = arenagrad_exec::ops::cuda_defines();
        let text = [
            SHIM,
            &defines,
            include_str!("../src/cuda/prelude.cu"),
            include_str!("../src/cuda/fused.cu"),
            DRIVER,
        ]
        .join("\n");
        std::fs::write(&src, text).map_err(|e| e.to_string())?;
        let exe = dir.join("driver");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(&cxx)
            .args(["-std=c++17", "-O1", "-ffp-contract=off", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .map_err(|e| format!("{cxx}: {e}"))?;
        if !out.status.success() {
            // A compiler that runs but rejects the source is a failure of the test, not a
            // missing tool.
            panic!(
                "{cxx} failed on the fused kernels:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(exe)
    });
    match built {
        Ok(p) => Some(p.as_path()),
        Err(why) => {
            skip_or_fail(
                REQUIRE_CXX,
                format_args!("no C++ compiler to run the CUDA kernels on the host ({why})"),
            );
            None
        }
    }
}

/// Runs the driver on `input` (the kind, the dtype flag, the launch shape, then the problem) and
/// returns its outputs.
fn run(exe: &Path, input: &[f64]) -> Vec<f64> {
    static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = exe.parent().unwrap();
    let (inp, outp) = (dir.join(format!("in{n}")), dir.join(format!("out{n}")));
    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&inp, bytes).unwrap();
    let status = Command::new(exe).arg(&inp).arg(&outp).status().unwrap();
    assert!(status.success(), "the driver failed: {status}");
    let out = std::fs::read(&outp).unwrap();
    out.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Values in [-1, 1) from a seed, rounded to `T`.
fn values<T: Float>(n: usize, seed: u64) -> Vec<T> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_f64((x % 20_001) as f64 / 10_000.0 - 1.0)
        })
        .collect()
}

/// The driver's input header: the problem's kind, whether it is f64, the launch shape.
fn header<T: Float>(kind: u32, grid: u64, block: u64) -> Vec<f64> {
    vec![
        f64::from(kind),
        f64::from(T::DTYPE == arenagrad_exec::DType::F64),
        grid as f64,
        block as f64,
    ]
}

fn push<T: Float>(input: &mut Vec<f64>, a: &[T]) {
    input.extend(a.iter().map(|v| v.to_f64()));
}

/// Takes the next `n` outputs.
fn take(out: &mut &[f64], n: usize) -> Vec<f64> {
    let (head, rest) = out.split_at(n);
    *out = rest;
    head.to_vec()
}

fn close<T: Float>(what: &str, got: &[f64], want: &[T]) {
    let rtol = if T::DTYPE == arenagrad_exec::DType::F64 {
        1e-12
    } else {
        1e-5
    };
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (&g, w)) in got.iter().zip(want).enumerate() {
        let w = w.to_f64();
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= rtol * w.abs().max(1.0)
        };
        assert!(ok, "{what}: element {k}: host-run CUDA {g} vs CPU {w}");
    }
}

const SHAPES: [(u64, u64); 2] = [(1, 1), (2, 3)];

fn norm_check<T: Float>(exe: &Path, rows: usize, n: usize, rms: bool, w: bool, b: bool) {
    let eps = 1e-5;
    let x = values::<T>(rows * n, 1);
    let (wv, bv) = (values::<T>(n, 2), values::<T>(n, 3));
    let gy = values::<T>(rows * n, 4);
    let mut st = vec![T::ZERO; 2 * rows];
    norm::norm_stats(&x, n, eps, rms, &mut st, 1);
    let mut y = vec![T::ZERO; rows * n];
    norm::norm_apply(
        &x,
        n,
        &st,
        w.then_some(&wv[..]),
        b.then_some(&bv[..]),
        &mut y,
        1,
    );
    let mut dx = vec![T::ZERO; rows * n];
    let spec = norm::NormSpec { n, rms };
    norm::norm_grad_input(spec, &x, &gy, &st, w.then_some(&wv[..]), &mut dx, 1);
    let (mut dw, mut db) = (vec![T::ZERO; n], vec![T::ZERO; n]);
    norm::norm_grad_params((&x, &gy, &st), n, Some(&mut dw), Some(&mut db), 1);
    let what = format!("{} {rows}×{n} rms {rms} w {w} b {b}", T::DTYPE);
    for (grid, block) in SHAPES {
        let mut input = header::<T>(1, grid, block);
        input.extend([
            rows as f64,
            n as f64,
            eps,
            f64::from(rms),
            f64::from(w),
            f64::from(b),
        ]);
        push(&mut input, &x);
        if w {
            push(&mut input, &wv);
        }
        if b {
            push(&mut input, &bv);
        }
        push(&mut input, &gy);
        let out = run(exe, &input);
        let mut o = &out[..];
        close(&format!("{what} stats"), &take(&mut o, 2 * rows), &st);
        close(&format!("{what} y"), &take(&mut o, rows * n), &y);
        close(&format!("{what} dx"), &take(&mut o, rows * n), &dx);
        let (gw, gb) = (take(&mut o, n), take(&mut o, n));
        if w {
            close(&format!("{what} dw"), &gw, &dw);
        }
        if b {
            close(&format!("{what} db"), &gb, &db);
        }
    }
}

#[test]
// Miri runs no child processes (nor a C++ compiler's output).
#[cfg_attr(miri, ignore)]
fn normalisations_match_the_cpu() {
    let Some(exe) = driver() else { return };
    for (rms, w, b) in [
        (false, true, true),
        (false, false, false),
        (true, true, false),
        (true, false, false),
    ] {
        norm_check::<f64>(exe, 7, 13, rms, w, b);
        norm_check::<f32>(exe, 5, 33, rms, w, b);
    }
    // A row of one element (variance 0), and no rows.
    norm_check::<f64>(exe, 3, 1, false, true, true);
    norm_check::<f32>(exe, 0, 4, false, true, true);
}

/// An attention problem: `lead` heads' shape, and the mask's shape over `[…lead, lq, lk]`.
struct Attn<'a> {
    lead: &'a [usize],
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    mask: Option<&'a [usize]>,
    dropout: f64,
}

fn attn_check<T: Float>(exe: &Path, a: &Attn<'_>) {
    let bh: usize = a.lead.iter().product();
    let dims = AttnDims {
        bh,
        lq: a.lq,
        lk: a.lk,
        d: a.d,
        dv: a.dv,
        scale: 1.0 / (a.d.max(1) as f64).sqrt(),
        causal: a.causal,
        dropout: a.dropout,
        seed: 0x1234_5678_9ABC_DEF1,
    };
    let scale3 = |v: Vec<T>| -> Vec<T> { v.into_iter().map(|x| x * T::from_f64(3.0)).collect() };
    let q = scale3(values::<T>(bh * a.lq * a.d, 5));
    let k = scale3(values::<T>(bh * a.lk * a.d, 6));
    let v = values::<T>(bh * a.lk * a.dv, 7);
    let go = values::<T>(bh * a.lq * a.dv, 8);
    // The mask broadcast to [lead…, lq, lk]: strides of its shape, 0 where its extent is 1; some
    // entries −∞, and one query row of the first head hidden whole.
    let (mask, offsets, lead_strides, rs, cs) = match a.mask {
        None => (Vec::new(), Vec::new(), Vec::new(), 0, 0),
        Some(ms) => {
            let mut full: Vec<usize> = a.lead.to_vec();
            full.extend([a.lq, a.lk]);
            let mut st = vec![0; full.len()];
            let mut acc = 1;
            for ax in (0..full.len()).rev() {
                st[ax] = if ms[ax] == 1 { 0 } else { acc };
                acc *= ms[ax];
            }
            let mut m = values::<T>(acc, 9);
            for (e, x) in m.iter_mut().enumerate() {
                if e % 7 == 3 {
                    *x = T::neg_infinity();
                }
            }
            let r = full.len();
            let row = st[r - 2];
            for j in 0..a.lk {
                m[row + j * st[r - 1]] = T::neg_infinity();
            }
            let lead = &a.lead;
            let offsets: Vec<usize> = (0..bh)
                .map(|h| {
                    let (mut rem, mut off) = (h, 0);
                    for ax in (0..lead.len()).rev() {
                        off += (rem % lead[ax]) * st[ax];
                        rem /= lead[ax];
                    }
                    off
                })
                .collect();
            (m, offsets, st[..r - 2].to_vec(), st[r - 2], st[r - 1])
        }
    };
    let mv = a.mask.map(|_| AttnMask {
        data: &mask,
        offsets: &offsets,
        rs,
        cs,
    });
    let mut o = vec![T::ZERO; bh * a.lq * a.dv];
    let mut lse = vec![T::ZERO; bh * a.lq];
    let inputs = attention::AttnInputs {
        q: &q,
        k: &k,
        v: &v,
        mask: mv.as_ref(),
        first: 0,
    };
    attention::attention_forward(&dims, &inputs, 0, &mut o, &mut lse);
    let mut dq = vec![T::ZERO; bh * a.lq * a.d];
    let mut dk = vec![T::ZERO; bh * a.lk * a.d];
    let mut dv = vec![T::ZERO; bh * a.lk * a.dv];
    let saved = attention::AttnSaved {
        o: &o,
        lse: &lse,
        go: &go,
    };
    let grads = attention::AttnGrads {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    attention::attention_backward(&dims, &inputs, &saved, (0, bh), grads);
    let what = format!(
        "{} lead {:?} {}×{} d {} dv {} causal {} mask {:?} dropout {}",
        T::DTYPE,
        a.lead,
        a.lq,
        a.lk,
        a.d,
        a.dv,
        a.causal,
        a.mask,
        a.dropout
    );
    let threshold = dropout::threshold(a.dropout);
    for (grid, block) in SHAPES {
        let mut input = header::<T>(2, grid, block);
        input.extend([
            bh as f64,
            a.lq as f64,
            a.lk as f64,
            a.d as f64,
            a.dv as f64,
            f64::from(a.causal),
            f64::from(a.mask.is_some()),
            f64::from(a.dropout > 0.0),
            (dims.seed >> 32) as f64,
            (dims.seed & 0xFFFF_FFFF) as f64,
            (threshold >> 32) as f64,
            (threshold & 0xFFFF_FFFF) as f64,
            dims.scale,
            1.0 / (1.0 - a.dropout),
            rs as f64,
            cs as f64,
            lead_strides.len() as f64,
        ]);
        if a.mask.is_some() {
            input.extend(a.lead.iter().map(|&e| e as f64));
            input.extend(lead_strides.iter().map(|&s| s as f64));
        }
        input.push(mask.len() as f64);
        for arr in [&q, &k, &v, &mask, &go] {
            push(&mut input, arr);
        }
        let out = run(exe, &input);
        let mut r = &out[..];
        close(&format!("{what} o"), &take(&mut r, o.len()), &o);
        close(&format!("{what} lse"), &take(&mut r, lse.len()), &lse);
        close(&format!("{what} dq"), &take(&mut r, dq.len()), &dq);
        close(&format!("{what} dk"), &take(&mut r, dk.len()), &dk);
        close(&format!("{what} dv"), &take(&mut r, dv.len()), &dv);
        assert!(r.is_empty());
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn attention_matches_the_cpu() {
    let Some(exe) = driver() else { return };
    let cases = [
        // Plain, more keys than one CPU tile, keys ≠ queries, dv ≠ d.
        Attn {
            lead: &[2, 3],
            lq: 37,
            lk: 45,
            d: 8,
            dv: 5,
            causal: false,
            mask: None,
            dropout: 0.0,
        },
        // Causal with a mask broadcast over the batch, a hidden row and hidden entries.
        Attn {
            lead: &[2, 2],
            lq: 9,
            lk: 9,
            d: 4,
            dv: 3,
            causal: true,
            mask: Some(&[1, 2, 9, 9]),
            dropout: 0.0,
        },
        // A mask broadcast over heads and queries (a key-padding mask), with dropout.
        Attn {
            lead: &[3],
            lq: 6,
            lk: 11,
            d: 6,
            dv: 7,
            causal: false,
            mask: Some(&[3, 1, 11]),
            dropout: 0.3,
        },
        // Causal with more keys than queries, and dropout.
        Attn {
            lead: &[2],
            lq: 5,
            lk: 8,
            d: 3,
            dv: 2,
            causal: true,
            mask: None,
            dropout: 0.5,
        },
        // A mask of its own for every batch and head (two leading strides), causal.
        Attn {
            lead: &[2, 3],
            lq: 5,
            lk: 6,
            d: 4,
            dv: 3,
            causal: true,
            mask: Some(&[2, 3, 5, 6]),
            dropout: 0.0,
        },
        // No queries, and no heads.
        Attn {
            lead: &[2],
            lq: 0,
            lk: 5,
            d: 4,
            dv: 4,
            causal: false,
            mask: None,
            dropout: 0.0,
        },
        Attn {
            lead: &[0, 2],
            lq: 3,
            lk: 4,
            d: 2,
            dv: 2,
            causal: false,
            mask: None,
            dropout: 0.0,
        },
        // No keys.
        Attn {
            lead: &[2],
            lq: 3,
            lk: 0,
            d: 4,
            dv: 4,
            causal: false,
            mask: None,
            dropout: 0.0,
        },
    ];
    for a in &cases {
        attn_check::<f64>(exe, a);
        attn_check::<f32>(exe, a);
    }
}
