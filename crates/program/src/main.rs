//! `arenagrad`: run, gradient-check, draw and format programs in arenagrad's text format.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::process::ExitCode;

use arenagrad_graph::check::GradcheckOptions;
use arenagrad_graph::{DType, HostData, HostTensor};
use arenagrad_program::{dtype_name, CheckOptions, Limits, Program, RunOptions, RunResult};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Run, differentiate, gradient-check and draw arenagrad programs.
#[derive(Debug, Parser)]
#[command(
    name = "arenagrad",
    version,
    after_help = "A program is UTF-8 text, one statement `NAME = OP ARG...` per line, `#` \
                  starting a comment; the last statement is the output. For example:\n\n  \
                  x = input 2 3\n  w = const 3 : 0.5 -1 2\n  y = mul x w\n  z = tanh y\n\n\
                  Exit status: 0 on success, 1 when gradcheck finds a mismatch, 2 on a parse, \
                  shape or usage error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a program forward and backward and print its output and gradients
    Run(RunArgs),
    /// Compare every input's gradient with central finite differences
    Gradcheck(GradcheckArgs),
    /// Print the program's graph in Graphviz DOT (ops, shapes, which nodes need grad)
    Dot(DotArgs),
    /// Parse a program and print it in canonical form
    Fmt(FmtArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DTypeArg {
    F64,
    F32,
    Bf16,
    F16,
}

impl From<DTypeArg> for DType {
    fn from(d: DTypeArg) -> DType {
        match d {
            DTypeArg::F64 => DType::F64,
            DTypeArg::F32 => DType::F32,
            DTypeArg::Bf16 => DType::BF16,
            DTypeArg::F16 => DType::F16,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Debug, Args)]
struct LimitArgs {
    /// Most elements any one tensor may hold
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_elements)]
    max_elements: usize,
    /// Most elements all of a run's buffers may hold together (values, gradients, copies)
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_total_elements)]
    max_total_elements: usize,
    /// Most work the forward pass may do (elements made plus matmul multiply-adds)
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_work)]
    max_work: u64,
    /// Most work a gradient check may do (two forward passes per input element)
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_check_work)]
    max_check_work: u64,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_elements: self.max_elements,
            max_total_elements: self.max_total_elements,
            max_work: self.max_work,
            max_check_work: self.max_check_work,
            ..Limits::default()
        }
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The program file (`-` reads standard input)
    #[arg(value_name = "FILE")]
    file: String,
    /// Element type
    #[arg(long, value_enum, default_value_t = DTypeArg::F64)]
    dtype: DTypeArg,
    /// Seed of the RNG that fills leaves given without values
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Device to run on
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Print one JSON object: dtype, output, values (every leaf), grads (every input)
    #[arg(long)]
    json: bool,
    /// Threads the kernels may use (default: ARENAGRAD_NUM_THREADS, else the CPUs this process may use)
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Debug, Args)]
struct GradcheckArgs {
    /// The program file (`-` reads standard input)
    #[arg(value_name = "FILE")]
    file: String,
    /// Element type (finite differences need f64)
    #[arg(long, value_enum, default_value_t = DTypeArg::F64)]
    dtype: DTypeArg,
    /// 1: first derivatives; 2: second derivatives too
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    order: u8,
    /// Seed of the RNG that fills leaves given without values
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Finite-difference step
    #[arg(long, default_value_t = GradcheckOptions::default().eps)]
    eps: f64,
    /// Absolute tolerance
    #[arg(long, default_value_t = GradcheckOptions::default().atol)]
    atol: f64,
    /// Relative tolerance
    #[arg(long, default_value_t = GradcheckOptions::default().rtol)]
    rtol: f64,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Debug, Args)]
struct DotArgs {
    /// The program file (`-` reads standard input)
    #[arg(value_name = "FILE")]
    file: String,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Debug, Args)]
struct FmtArgs {
    /// The program file (`-` reads standard input)
    #[arg(value_name = "FILE")]
    file: String,
}

/// A failure: what to print and the exit code.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: String) -> Self {
        Failure { code: 2, message }
    }
}

fn read(file: &str) -> Result<Vec<u8>, Failure> {
    let r = if file == "-" {
        let mut v = Vec::new();
        std::io::stdin().read_to_end(&mut v).map(|_| v)
    } else {
        std::fs::read(file)
    };
    r.map_err(|e| Failure::usage(format!("cannot read {file}: {e}")))
}

fn load(file: &str) -> Result<Program, Failure> {
    let bytes = read(file)?;
    let shown = if file == "-" { "<stdin>" } else { file };
    Program::parse_bytes(&bytes).map_err(|e| Failure::usage(format!("{shown}: {e}")))
}

fn located(file: &str, e: impl std::fmt::Display) -> Failure {
    let shown = if file == "-" { "<stdin>" } else { file };
    Failure::usage(format!("{shown}: {e}"))
}

/// `shape [..] [v, v, ...]`, written element by element: the output of a large program is
/// streamed, never built as one string.
fn write_tensor(out: &mut impl Write, t: &HostTensor) -> std::io::Result<()> {
    /// The elements, each widened to f64 as it is printed.
    fn items<T: Copy + Into<f64>>(out: &mut impl Write, v: &[T]) -> std::io::Result<()> {
        for (k, &x) in v.iter().enumerate() {
            if k > 0 {
                out.write_all(b", ")?;
            }
            write!(out, "{:?}", x.into())?;
        }
        Ok(())
    }
    /// Integer and boolean elements as they are.
    fn ints<T: std::fmt::Display>(out: &mut impl Write, v: &[T]) -> std::io::Result<()> {
        for (k, x) in v.iter().enumerate() {
            if k > 0 {
                out.write_all(b", ")?;
            }
            write!(out, "{x}")?;
        }
        Ok(())
    }
    write!(out, "shape {:?} [", t.shape())?;
    match t.data() {
        HostData::F32(v) => items(out, v)?,
        HostData::F64(v) => items(out, v)?,
        HostData::BF16(v) => items(out, v)?,
        HostData::F16(v) => items(out, v)?,
        HostData::I64(v) => ints(out, v)?,
        HostData::I32(v) => ints(out, v)?,
        HostData::U8(v) => ints(out, v)?,
        HostData::Bool(v) => ints(out, &v.iter().map(|b| b.get()).collect::<Vec<_>>())?,
    }
    out.write_all(b"]")
}

fn print_human(out: &mut impl Write, r: &RunResult) -> std::io::Result<()> {
    writeln!(out, "dtype {}", dtype_name(r.dtype))?;
    write!(out, "output {}: ", r.output.name)?;
    write_tensor(out, &r.output.tensor)?;
    writeln!(out)?;
    for v in &r.values {
        write!(out, "value {}: ", v.name)?;
        write_tensor(out, &v.tensor)?;
        writeln!(out)?;
    }
    for g in &r.grads {
        write!(out, "grad {}: ", g.name)?;
        write_tensor(out, &g.tensor)?;
        writeln!(out)?;
    }
    Ok(())
}

fn run(a: &RunArgs) -> Result<u8, Failure> {
    if a.device == DeviceArg::Cuda {
        return Err(Failure::usage(
            "--device cuda: CUDA is not available in this build of arenagrad (it runs on the \
             CPU only); use --device cpu"
                .into(),
        ));
    }
    let p = load(&a.file)?;
    let opts = RunOptions {
        dtype: a.dtype.into(),
        seed: a.seed,
        limits: a.limits.limits(),
        threads: a.threads,
        ..RunOptions::default()
    };
    let r = p.run(&opts).map_err(|e| located(&a.file, e))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let w = if a.json {
        r.write_json(&mut out).and_then(|()| writeln!(out))
    } else {
        print_human(&mut out, &r)
    }
    .and_then(|()| out.flush());
    w.map_err(|e| Failure::usage(format!("cannot write the output: {e}")))?;
    Ok(0)
}

fn gradcheck(a: &GradcheckArgs) -> Result<u8, Failure> {
    if a.dtype != DTypeArg::F64 {
        return Err(Failure::usage(
            "--dtype f32: gradcheck compares with finite differences, which need f64; use \
             --dtype f64"
                .into(),
        ));
    }
    let tolerances = GradcheckOptions {
        eps: a.eps,
        atol: a.atol,
        rtol: a.rtol,
        ..GradcheckOptions::default()
    };
    // A step of 0, NaN or inf (or a negative tolerance) is a usage error, not a failed check.
    tolerances.validate().map_err(|e| {
        Failure::usage(format!(
            "--eps {} --atol {} --rtol {}: {e}",
            a.eps, a.atol, a.rtol
        ))
    })?;
    let p = load(&a.file)?;
    let opts = CheckOptions {
        tolerances,
        progress: true,
        second_order: a.order == 2,
        seed: a.seed,
        limits: a.limits.limits(),
        ..CheckOptions::default()
    };
    let report = p.gradcheck(&opts).map_err(|e| located(&a.file, e))?;
    println!(
        "gradcheck of {} (eps {:e}, atol {:e}, rtol {:e})",
        if a.file == "-" { "<stdin>" } else { &a.file },
        a.eps,
        a.atol,
        a.rtol
    );
    println!("{report}");
    Ok(if report.passed { 0 } else { 1 })
}

fn dot(a: &DotArgs) -> Result<u8, Failure> {
    let p = load(&a.file)?;
    let d = p
        .to_dot(&a.limits.limits())
        .map_err(|e| located(&a.file, e))?;
    print!("{d}");
    Ok(0)
}

fn fmt(a: &FmtArgs) -> Result<u8, Failure> {
    let p = load(&a.file)?;
    print!("{p}");
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Run(a) => run(a),
        Command::Gradcheck(a) => gradcheck(a),
        Command::Dot(a) => dot(a),
        Command::Fmt(a) => fmt(a),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("arenagrad: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
