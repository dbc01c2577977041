"""The PyTorch side of `make bench-gpu` (scripts/bench/gpu/run.sh), on the same GPU.

    python3 scripts/bench/gpu/bench_gpu_torch.py

Prints '#' lines for people and one parseable line per figure,
    ROW <key> <value> <unit>
with the keys of the mpengine side (bench_gpu.lua, build/bench/gpu_kernels):

  mlp_samples_per_s, mlp_peak_mem   the Fashion-MNIST MLP (784-512-256-10, ReLU) at batch
        1024, eager, torch.autocast("cuda", float16) + GradScaler + Adam(fused=True), on
        synthetic data already on the GPU; peak = torch.cuda.max_memory_allocated() (run
        first, in a fresh process, so that nothing else is in it)
  gpt_tokens_per_s, gpt_mfu, gpt_peak_mem (eager) and gpt_compiled_tokens_per_s,
        gpt_compiled_mfu, gpt_compiled_peak_mem (torch.compile): GPT-2 small (12 layers,
        d 768, 12 heads, T 1024, vocab 50304, tied output, PyTorch's default init) at
        batch MP_BENCH_GPT_BATCH (32; MP_BENCH_GPT_STEPS="warm-up,steps,trials", 3,10,3),
        autocast float16 + GradScaler + AdamW(fused=True),
        F.scaled_dot_product_attention (causal); each in a fresh process (`gpt`,
        `gpt_compiled`) so that the peaks are its own
  matmul_{f16,bf16}_{4096,8192}     TFLOP/s of torch.matmul(A, B), square
  copy_gbs, unscale_gbs, adamw_gbs  GB/s over 2^28 f32 values (1 GiB arrays): dst.copy_(src),
        torch._amp_foreach_non_finite_check_and_unscale_ (GradScaler's unscale pass), and
        torch.optim.AdamW(fused=True).step(); bytes counted as on the mpengine side
        (8, 8 and 28 per value)

Timing as on the mpengine side: torch.cuda.synchronize(), a loop of reps,
torch.cuda.synchronize(), time.perf_counter(); several trials after a warm-up, the
median trial. Nothing in the timed loops reads a value back (no .item()).

MP_BENCH_SMOKE=1: tiny sizes on the CPU, to check the script runs (not a measurement).
Exits 0 with one "skipped" line when torch or a CUDA device is missing.
"""
import os
import statistics
import sys
import time

SMOKE = os.environ.get("MP_BENCH_SMOKE", "") not in ("", "0")

try:
    import torch
except ImportError as e:
    print(f"# bench_gpu_torch: skipped: PyTorch not importable ({e})")
    sys.exit(0)

if not SMOKE and not torch.cuda.is_available():
    print(f"# bench_gpu_torch: skipped: no GPU for PyTorch {torch.__version__} (torch.cuda.is_available() is false)")
    sys.exit(0)

DEV = "cpu" if SMOKE else "cuda"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def one_line(e):
    return (str(e).splitlines() or [""])[0][:200]


def row(key, value, unit):
    print(f"ROW {key} {value:.6g} {unit}")


def timed(fn, reps, trials, warmup):
    """median over trials of (seconds per call), each trial reps calls between two syncs"""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def grad_scaler():
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        try:
            return torch.amp.GradScaler(DEV)
        except (TypeError, RuntimeError):
            pass
    return torch.cuda.amp.GradScaler(enabled=DEV == "cuda")


def bench_mlp():
    batch = 32 if SMOKE else 1024
    warmup, steps, trials = (2, 3, 2) if SMOKE else (30, 200, 3)
    nb = 8
    ws = 0
    if DEV == "cuda":
        # what one cuBLAS call leaves allocated (PyTorch's cuBLAS/cuBLASLt workspaces come from its
        # caching allocator and count in max_memory_allocated; mpengine's peak counts tensors only)
        x = torch.ones(64, 64, device=DEV, dtype=torch.float16)
        before = torch.cuda.memory_allocated()
        y = x @ x
        del y
        sync()
        ws = torch.cuda.memory_allocated() - before
        del x
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    # synthetic data already on the device (as on the mpengine side): inputs in [0,1], labels 0..9
    batches = [(torch.rand(batch, 784, device=DEV),
                torch.tensor([(i * 7919 + j * 104729) % 10 for j in range(1, batch + 1)], device=DEV))
               for i in range(1, nb + 1)]
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(DEV)
    try:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        fused = "fused=True"
    except (RuntimeError, TypeError, ValueError) as e:   # an old torch on the CPU (smoke test)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        fused = f"not fused: {one_line(e)}"
    scaler = grad_scaler()
    amp_dtype = torch.float16 if DEV == "cuda" else torch.bfloat16
    state = {"s": 0, "loss": None}

    def step():
        x, y = batches[state["s"] % nb]
        state["s"] += 1
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEV, dtype=amp_dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        state["loss"] = loss

    s = timed(step, steps, trials, warmup)
    peak = torch.cuda.max_memory_allocated() if DEV == "cuda" else 0
    print(f"# torch {torch.__version__} mlp 784-512-256-10 batch {batch}, eager, autocast({DEV}, {amp_dtype}) + "
          f"GradScaler + Adam({fused}): {s * 1e3:.3f} ms/step (median of {trials} trials x {steps} steps), "
          f"{batch / s:.0f} samples/s")
    if DEV == "cuda":
        print(f"# torch mlp peak: max_memory_allocated {peak / 2**20:.1f} MiB (of which {base / 2**20:.1f} MiB "
              f"allocated before the model, and cuBLAS workspace ~{ws / 2**20:.1f} MiB that mpengine's figure "
              f"does not count)")
    print(f"# torch mlp after {state['s']} steps: loss {state['loss'].item():.4f}, loss scale {scaler.get_scale()} "
          f"(synthetic data: random inputs in [0,1], random labels)")
    row("mlp_samples_per_s", batch / s, "samples/s")
    if DEV == "cuda":
        row("mlp_peak_mem", peak / 2**20, "MiB")


def bench_matmul():
    sizes = (64, 128) if SMOKE else (4096, 8192)
    trials = 2 if SMOKE else 5
    if DEV == "cuda":
        m = torch.backends.cuda.matmul
        flags = ", ".join(f"{k}={getattr(m, k, '?')}" for k in (
            "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"))
        print(f"# torch matmul settings (the defaults): {flags}")
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        for n in sizes:
            torch.manual_seed(0)
            a = torch.randn(n, n, device=DEV, dtype=dt)
            b = torch.randn(n, n, device=DEV, dtype=dt)
            reps = 3 if SMOKE else (200 if n <= 4096 else 30)
            try:
                s = timed(lambda: torch.matmul(a, b), reps, trials, 5)
            except RuntimeError as e:
                if not SMOKE:
                    raise
                print(f"# torch matmul {name} n={n}: not supported on this CPU build ({one_line(e)})")
                continue
            tflops = 2 * n**3 / s / 1e12
            print(f"# torch matmul {name} n={n}: {s * 1e3:.3f} ms per C = A@B (median of {trials} trials x {reps} reps), "
                  f"{tflops:.1f} TFLOP/s")
            row(f"matmul_{name}_{n}", tflops, "TFLOP/s")
            del a, b


def bench_kernels():
    n = 1 << 16 if SMOKE else 1 << 28
    reps, trials = (3, 3) if SMOKE else (20, 11)
    g = torch.randn(n, device=DEV)
    src = torch.randn(n, device=DEV)
    dst = torch.zeros(n, device=DEV)
    figures = {}

    def measure(key, fn, bytes_per_value):
        try:
            figures[key] = (timed(fn, reps, trials, reps), bytes_per_value)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            if not SMOKE:
                raise
            print(f"# torch {key}: not supported on this CPU build ({one_line(e)})")

    # dst.copy_(src): 8 bytes per value moved
    measure("copy", lambda: dst.copy_(src), 8)
    # GradScaler's unscale + inf/NaN check (one tensor; scale alternates 2^16 and 2^-16 as on the mpengine side)
    found_inf = torch.zeros(1, device=DEV)
    invs = [torch.full((1,), 1.0 / 65536, device=DEV), torch.full((1,), 65536.0, device=DEV)]
    flip = [0]

    def unscale():
        flip[0] ^= 1
        torch._amp_foreach_non_finite_check_and_unscale_([g], found_inf, invs[flip[0]])

    measure("unscale", unscale, 8)
    # fused AdamW: p, g, m, v read, p, m, v written: 28 bytes per value
    p = torch.nn.Parameter(torch.randn(n, device=DEV))
    p.grad = torch.randn(n, device=DEV)
    try:
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    except (RuntimeError, TypeError, ValueError) as e:
        if not SMOKE:
            raise
        print(f"# torch fused AdamW not available here ({one_line(e)}): the unfused one")
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01)
    measure("adamw", opt.step, 28)
    print(f"# torch kernels: {n} f32 values ({4 * n / 2**30:.2f} GiB per array), median of {trials} trials x {reps} calls")
    for k, (s, b) in figures.items():
        print(f"# torch {k:8s} {s * 1e3:8.3f} ms  {b * n / s / 1e9:8.1f} GB/s  ({b} B per value)")
        row(f"{k}_gbs", b * n / s / 1e9, "GB/s")


def bench_gpt(compiled=False):
    import torch.nn.functional as F
    if SMOKE:
        V, T, L, D, H, B = 128, 32, 2, 64, 4, 2
    else:
        V, T, L, D, H, B = 50304, 1024, 12, 768, 12, int(os.environ.get("MP_BENCH_GPT_BATCH", "32"))
    warmup, steps, trials = (1, 2, 1) if SMOKE else (3, 10, 3)
    if not SMOKE and os.environ.get("MP_BENCH_GPT_STEPS"):   # warm-up,steps,trials, as bench_gpu.lua
        warmup, steps, trials = (int(v) for v in os.environ["MP_BENCH_GPT_STEPS"].split(","))

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from bench_gpt_torch import GPT   # the one PyTorch definition of the project's GPT
    torch.manual_seed(0)
    model = GPT(vocab=V, ctx=T, layers=L, dim=D, heads=H).to(DEV)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    keep = [p for n, p in model.named_parameters() if not any(p is d for d in decay)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=6e-4, fused=DEV == "cuda")
    except TypeError:   # PyTorch 1.x
        opt = torch.optim.AdamW(groups, lr=6e-4)
    scaler = grad_scaler()
    amp_dtype = torch.float16 if DEV == "cuda" else torch.bfloat16
    fwd = torch.compile(model) if compiled else model
    x = torch.randint(0, V, (B, T), device=DEV)
    y = torch.randint(0, V, (B, T), device=DEV)
    state = {}

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEV, dtype=amp_dtype):
            state["loss"] = F.cross_entropy(fwd(x).reshape(-1, V).float(), y.reshape(-1))
        scaler.scale(state["loss"]).backward()
        scaler.step(opt)
        scaler.update()

    s = timed(step, steps, trials, warmup)
    tokens = B * T / s
    mfu = tokens * (6 * nparams + 6 * L * T * D) / 989e12
    peak = torch.cuda.max_memory_allocated() / 2**20 if DEV == "cuda" else 0.0
    key = "gpt_compiled" if compiled else "gpt"
    print(f"# torch {torch.__version__} {key} {L}L d{D} h{H} T{T} vocab {V} ({nparams / 1e6:.1f} M parameters) batch {B}, "
          f"{'torch.compile' if compiled else 'eager'}, autocast({DEV}, {amp_dtype}) + GradScaler + AdamW: "
          f"{s * 1e3:.1f} ms/step, {tokens:.0f} tokens/s, MFU {mfu * 100:.1f}%, peak {peak:.0f} MiB; "
          f"loss {state['loss'].item():.3f}")
    row(f"{key}_tokens_per_s", tokens, "tokens/s")
    row(f"{key}_mfu", mfu * 100, "%")
    row(f"{key}_peak_mem", peak, "MiB")


def bench_cnn():
    import torch.nn.functional as F
    batch = 16 if SMOKE else int(os.environ.get("MP_BENCH_CNN_BATCH", "4096"))
    warmup, steps, trials = (1, 2, 1) if SMOKE else (5, 20, 3)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from cnn_accuracy_torch import cnn   # the one PyTorch definition of the project's CNN
    if DEV == "cuda":
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = cnn().to(DEV)
    try:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=DEV == "cuda")
    except TypeError:   # PyTorch 1.x
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = grad_scaler()
    amp_dtype = torch.float16 if DEV == "cuda" else torch.bfloat16
    x = torch.rand(batch, 1, 28, 28, device=DEV)
    y = torch.randint(0, 10, (batch,), device=DEV)
    state = {}

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEV, dtype=amp_dtype):
            state["loss"] = F.cross_entropy(model(x), y)
        scaler.scale(state["loss"]).backward()
        scaler.step(opt)
        scaler.update()

    s = timed(step, steps, trials, warmup)
    peak = torch.cuda.max_memory_allocated() / 2**20 if DEV == "cuda" else 0.0
    print(f"# torch {torch.__version__} cnn batch {batch}, eager, autocast({DEV}, {amp_dtype}) + GradScaler + Adam: "
          f"{s * 1e3:.2f} ms/step, {batch / s:.0f} samples/s, peak {peak:.0f} MiB; loss {state['loss'].item():.3f}")
    row("cnn_samples_per_s", batch / s, "samples/s")
    if DEV == "cuda":
        row("cnn_peak_mem", peak, "MiB")


def bench_attention():
    """F.scaled_dot_product_attention forward + backward (its flash kernel on a GPU), the shape and FLOP count of
    bench_gpu.lua's attention rows"""
    import torch.nn.functional as F
    if not hasattr(F, "scaled_dot_product_attention"):
        print(f"# torch {torch.__version__} attention: skipped: no F.scaled_dot_product_attention before PyTorch 2.0")
        return
    B = 1 if SMOKE else int(os.environ.get("MP_BENCH_ATTN_BATCH", "8"))
    H, T, D = (2, 64, 64) if SMOKE else (12, 1024, 64)
    warmup, steps, trials = (1, 2, 1) if SMOKE else (3, 20, 3)
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, device=DEV, dtype=dt, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, T, D, device=DEV, dtype=dt)

        def step():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

        s = timed(step, steps, trials, warmup)
        flops = 7 * B * H * T * T * D
        print(f"# torch {torch.__version__} attention {name} B{B} H{H} T{T} d{D} causal, SDPA forward + backward: "
              f"{s * 1e3:.3f} ms, {flops / s / 1e12:.1f} TFLOP/s")
        row(f"attention_{name}", flops / s / 1e12, "TFLOP/s")


def main():
    if DEV == "cuda":
        print(f"# torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
    else:
        print(f"# torch {torch.__version__} on the CPU (MP_BENCH_SMOKE: tiny sizes, not a measurement)")
    what = sys.argv[1:] or ["mlp", "matmul", "kernels"]
    failed = []
    for w in what:   # the MLP first: its peak-memory figure wants a fresh process
        try:
            {"mlp": bench_mlp, "matmul": bench_matmul, "kernels": bench_kernels, "gpt": bench_gpt, "cnn": bench_cnn,
             "attention": bench_attention,
             "gpt_compiled": lambda: bench_gpt(compiled=True)}[w]()
        except Exception as e:   # report, and go on with the other parts
            print(f"# torch {w}: FAILED: {type(e).__name__}: {one_line(e)}")
            failed.append(w)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
