"""results.md from the results dictionary (results.json holds the same and more)."""

from __future__ import annotations

from typing import Any


def one_line(name: str, record: dict[str, Any]) -> str:
    """A few words on what a part found, for the progress line and the overview table."""
    details = record.get("details") or {}
    if name == "environment" and details:
        device = details.get("device") or {}
        missing = ", ".join(details.get("missing_required") or []) or "none"
        return (f" {device.get('name') or 'no CUDA device'}; torch {device.get('torch')}, CUDA "
                f"{device.get('torch_cuda')}, driver {device.get('driver')}; missing required modules: {missing}")
    if name in ("cuda_tests", "compile_smoke") and details.get("counts"):
        counts = details["counts"]
        return f" {counts['passed']} passed, {counts['failed'] + counts['error']} failed, {counts['skipped']} skipped"
    if name.startswith("throughput") and details.get("results"):
        ours, theirs = details["results"]["bertkit"], details["results"]["transformers"]
        line = (f" batch {details['batch']}: bertkit {ours['tokens_per_s']:,.0f} tok/s (MFU {ours['mfu']:.1%}), "
                f"transformers {theirs['tokens_per_s']:,.0f} tok/s (MFU {theirs['mfu']:.1%}), {details['ratio']:.2f}x")
        if "bertkit --compile" in details["results"]:
            compiled = details["results"]["bertkit --compile"]
            line += (f"; bertkit --compile {compiled['tokens_per_s']:,.0f} tok/s (MFU {compiled['mfu']:.1%}), "
                     f"{details['compile_ratio']:.2f}x")
        return line
    if name in ("ladder", "phase2", "large") and details.get("best"):
        best = details["results"][details["best"]["name"]]
        line = (f" fastest: {details['best']['name']}, batch {details['batch']}: {best['tokens_per_s']:,.0f} tok/s, "
                f"MFU {best['mfu']:.1%}")
        if details.get("best_vs_transformers"):
            line += f", {details['best_vs_transformers']:.2f}x transformers"
        if details.get("numerics"):
            line += f"; numerics {'agree' if details['numerics']['agree'] else 'DIFFER'}"
        return line
    if name == "profile" and details.get("by_kind_ms_per_step"):
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in list(details["by_kind_ms_per_step"].items())[:4])
        return (f" {details['wall_ms_per_step']:.1f} ms/step, GPU busy {details['busy_fraction']:.0%}; ms/step by "
                f"kind: {kinds}")
    if name == "checkpointing" and details.get("results"):
        return (f" batch {details['batch']} x {details['seq_length']}: {details['time_ratio']:.2f}x the step time, "
                f"{details.get('memory_ratio', float('nan')):.2f}x the peak memory; largest batch "
                f"{details.get('largest_batch')}")
    if name == "process_group" and "group_joined" in details:
        return f" backend {details.get('backend')}, {details.get('steps', '?')} steps through fit"
    return ""


def markdown(results: dict[str, Any], parts) -> str:
    env = results.get("environment") or {}
    device = env.get("device") or {}
    title = device.get("name") or ("CPU (dry run)" if results["dry_run"] else "no CUDA device")
    lines = [f"# GPU check: {title}", "",
             f"{'Dry run (CPU, tiny model). ' if results['dry_run'] else ''}Started {results['started_utc']}, "
             f"{results['total_s']:.0f} s of a {results['budget_s']:.0f} s budget"
             f"{'' if results.get('complete') else ' (still running)'}; commit {env.get('commit') or 'unknown'}. "
             f"Overall: **{'ok' if results['ok'] else 'NOT ok'}**.", "",
             "| part | status | seconds | result |", "|---|---|---|---|"]
    for part in parts:
        record = results["parts"].get(part.name)
        if record is None:
            lines.append(f"| {part.title} | not run yet | | |")
            continue
        details = env if part.name == "environment" else record.get("details")
        note = one_line(part.name, {"details": details}).strip() or first_line(record.get("error"))
        lines.append(f"| {part.title} | {record['status']} | {record['seconds']:.1f} | {cell(note)} |")
    lines += environment_section(env)
    parts_done = {name: r for name, r in results["parts"].items() if r["status"] != "skipped"}
    for name in ("cuda_tests", "compile_smoke"):
        if name in parts_done:
            lines += tests_section(parts_done[name])
    if "process_group" in parts_done:
        lines += process_group_section(parts_done["process_group"])
    for name in ("ladder", "phase2", "large"):
        if name in parts_done:
            lines += ladder_section(parts_done[name], results["dry_run"])
    for name in ("throughput", "throughput_tf32", "throughput_compile"):
        if name in parts_done:
            lines += throughput_section(parts_done[name], results["dry_run"])
    if "profile" in parts_done:
        lines += profile_section(parts_done["profile"])
    if "checkpointing" in parts_done:
        lines += checkpointing_section(parts_done["checkpointing"])
    failures = [(name, r) for name, r in parts_done.items() if r["status"] in ("failed", "timeout") and r.get("error")]
    if failures:
        lines += ["", "## Errors", ""]
        for _, record in failures:
            lines += [f"### {record['title']} ({record['status']})", "", "```", record["error"].strip()[-3000:],
                      "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def environment_section(env: dict[str, Any]) -> list[str]:
    if not env:
        return []
    device = env.get("device") or {}
    lines = ["", "## Environment", "",
             f"- Python {env.get('python')} ({env.get('executable')}), {env.get('platform')}, {env.get('cpus')} CPUs",
             f"- torch {device.get('torch')}, CUDA {device.get('torch_cuda')}, cuDNN {device.get('cudnn')}, "
             f"NCCL {device.get('nccl')}, driver {device.get('driver')}"]
    if device.get("cuda_available"):
        lines.append(f"- {device.get('device_count')} x {device.get('name')} (compute capability "
                     f"{device.get('capability')}, {device.get('memory_gib')} GiB, {device.get('multiprocessors')} "
                     f"SMs), bf16 supported: {device.get('bf16')}")
    else:
        lines.append("- no CUDA device")
    missing = env.get("missing_required") or []
    lines.append(f"- missing required modules: {', '.join(missing) if missing else 'none'}")
    optional = ", ".join(env.get("missing_optional") or []) or "none"
    lines.append(f"- missing optional modules (their tests skip): {optional}")
    modules = env.get("modules") or {}
    lines.append("- versions: " + ", ".join(f"{name} {version}" for name, version in modules.items() if version))
    return lines


def tests_section(record: dict[str, Any]) -> list[str]:
    details = record.get("details") or {}
    lines = ["", f"## {record['title']}", "", f"`{details.get('command', '')}`", "",
             f"{details.get('summary_line') or record['status']}", ""]
    tests = details.get("tests") or []
    interesting = [t for t in tests if t["outcome"] not in ("passed", "skipped")]
    if interesting:
        lines += ["| test | outcome | message |", "|---|---|---|"]
        lines += [f"| {cell(t['name'])} | {t['outcome']} | {cell(first_line(t.get('message'), 200))} |"
                  for t in interesting]
        lines.append("")
    ran = [t for t in tests if t["outcome"] == "passed"]
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    lines.append(f"{len(ran)} passed" + (": " + ", ".join(f"`{t['name'].split('::')[-1]}`" for t in ran[:60])
                                         + (" ..." if len(ran) > 60 else "") if ran else ""))
    if skipped:
        reasons: dict[str, int] = {}
        for test in skipped:
            reason = first_line(test.get("message"), 120) or "no reason given"
            reasons[reason] = reasons.get(reason, 0) + 1
        lines += ["", f"{len(skipped)} skipped: " + "; ".join(f"{n} x {reason}" for reason, n in reasons.items())]
    return lines


def process_group_section(record: dict[str, Any]) -> list[str]:
    details = record.get("details") or {}
    context = details.get("context") or {}
    lines = ["", f"## {record['title']}", "",
             f"- environment: {details.get('environment')}",
             f"- process group joined: {details.get('group_joined')}, backend {details.get('backend')}; "
             f"context: rank {context.get('rank')}, world size {context.get('world_size')}, device "
             f"{context.get('device')}, distributed {context.get('distributed')}",
             f"- all-reduce on the device: {details.get('all_reduce', 'not run')}",
             f"- fit: {details.get('steps')} steps ({details.get('stop_reason')}), "
             f"precision {details.get('precision')}, "
             f"skipped steps {details.get('skipped_steps')}, losses "
             f"{', '.join(f'{x:.3f}' for x in details.get('train_losses') or [])}",
             f"- evaluations: {len(details.get('evaluations') or [])}; checkpoints: {details.get('checkpoints')}",
             f"- torn down: {details.get('torn_down')}"]
    return lines


def throughput_section(record: dict[str, Any], dry_run: bool) -> list[str]:
    details = record.get("details") or {}
    lines = ["", f"## {record['title']}", ""]
    if not details.get("results"):
        search = details.get("search")
        return [*lines, f"{record['status']}; batch search: {search}" if search else record["status"]]
    lines += [f"{details['model']}, {details['seq_length']} tokens, full rows, {details['precision']}, "
              f"{details['device_name']}; torch {details['torch']}, transformers {details['transformers']} "
              f"(attention: {details['transformers_attention']}). Batch {details['batch']} (search: "
              + ", ".join(f"{s['batch']} {s['result']}" for s in details["search"]) + "); "
              f"{details['rounds']} timed rounds of {details['steps_per_round']} steps after a warm-up round, "
              "the two implementations alternating; median round.", "",
              "| implementation | ms/step | tokens/s | model TFLOP/s | MFU | MFU vs measured matmul "
              "| peak memory GiB |",
              "|---|---|---|---|---|---|---|"]
    for name, result in details["results"].items():
        memory = result["peak_memory_gib"]
        lines.append(f"| {name} | {result['ms_per_step']:.1f} | {result['tokens_per_s']:,.0f} | "
                     f"{result['model_tflops']:.3g} | {result['mfu']:.1%} | "
                     f"{result['mfu_vs_measured_matmul']:.1%} | {'' if memory is None else memory} |")
    lines += ["", f"bertkit / transformers tokens/s: **{details['ratio']:.2f}x**.", "",
              f"Peak: {details['peak_tflops']:.4g} TFLOP/s ({details['peak_source']}); measured matmul "
              f"{details['measured_matmul_tflops']:.4g} TFLOP/s. Model FLOPs per step "
              f"{details['model_tflop_per_step']:.4g} T ({details['tokens_per_step']:,} tokens, "
              f"{details['masked_per_step']:,} masked). FLOP rule: {details['flop_rule']}. transformers' MLM head at "
              f"the unmasked positions adds {details['transformers_uncounted_head_fraction']:.1%} to that count, "
              "not counted."]
    if dry_run:
        lines += ["", "Dry run: a tiny model on a CPU; these numbers exercise the code and measure nothing."]
    return lines


def ladder_section(record: dict[str, Any], dry_run: bool) -> list[str]:
    """The rungs' table; then the numerics, the largest batch, the phase-2 data and the profile when there."""
    details = record.get("details") or {}
    lines = ["", f"## {record['title']}", ""]
    if not details.get("results"):
        return [*lines, f"{record['status']}: {first_line(record.get('error'), 300)}"]
    lines += [f"{details['model']}, {details['seq_length']} tokens, batch {details['batch']}, bf16 autocast, real text "
              f"(the bundled KJV, bert-base-uncased vocabulary, Google's masking, at most {details['predictions']} "
              f"predictions a row); {details['device_name']}, torch {details['torch']}. Model FLOPs per step "
              f"{details['model_tflop_per_step']:.4g} T; peak {details['peak_tflops']:.4g} TFLOP/s "
              f"({details['peak_source']}).", "",
              "| variant | ms/step | tokens/s | MFU | compile s | peak GiB |", "|---|---|---|---|---|---|"]
    for name, result in details["results"].items():
        memory = result.get("peak_memory_gib")
        lines.append(f"| {cell(name)} | {result['ms_per_step']:.1f} | {result['tokens_per_s']:,.0f} | "
                     f"{result['mfu']:.1%} | {result['compile_s']} | {'' if memory is None else memory} |")
    if details.get("best"):
        lines += ["", f"Fastest bertkit variant: **{details['best']['name']}**"
                  + (f", **{details['best_vs_transformers']:.2f}x** transformers" if details.get("best_vs_transformers")
                     else "") + "."]
    if details.get("best_from_ladder"):
        lines += ["", f"Levers: {details['best_from_ladder']}."]
    if details.get("phase2_data"):
        data = details["phase2_data"]
        lines += ["", f"Real phase-2 data: {data['instances']} instances, fill {data['fill']:.0%} (real tokens over "
                      f"rows x {details['seq_length']}), at most {data['max_predictions']} predictions; "
                      f"{data['note']}."]
    numerics = details.get("numerics")
    if numerics:
        lines += ["", f"Numerics: {numerics['candidate']} against {numerics['reference']}, {numerics['steps']} steps "
                      f"from the same weights on the same batches: windowed mean losses differ by at most "
                      f"{numerics['max_window_gap']:.3f} nats (allowed {numerics['allowed_gap_nats']:.3f}; the "
                      f"reference against itself with another dropout seed: {numerics['seed_noise_nats']:.3f}), the "
                      f"last window by {numerics['final_relative_gap']:.2%} (tolerance {numerics['tolerance']}): "
                      f"**{'agree' if numerics['agree'] else 'DIFFER'}**. First/last loss: {numerics['first_last']}."]
    largest = details.get("largest_batch")
    if largest:
        lines += ["", f"Largest batch of the fastest variant's kernels (one eager step): {largest['largest']} "
                      f"(peak {largest['peak_memory_gib']} GiB); tried {largest['tried']}."]
    for name, error in (details.get("errors") or {}).items():
        lines += ["", f"- {cell(name)}: {cell(first_line(error, 300))}"]
    if details.get("profile"):
        lines += profile_lines(details["profile"])
    if dry_run:
        lines += ["", "Dry run: a tiny model on a CPU; these numbers exercise the code and measure nothing."]
    return lines


def profile_lines(profile: dict[str, Any]) -> list[str]:
    lines = ["", f"Profile of {profile['variant']}: {profile['steps']} steps; {profile['timed_on']}. Wall "
                 f"{profile['wall_ms_per_step']:.1f} ms/step, kernels busy {profile['busy_ms_per_step']:.1f} ms/step "
                 f"({(profile['busy_fraction'] or 0):.0%}).", "", "| kind | ms/step |", "|---|---|"]
    lines += [f"| {kind} | {ms:.2f} |" for kind, ms in profile["by_kind_ms_per_step"].items()]
    lines += ["", "| kernel | kind | ms/step | calls/step |", "|---|---|---|---|"]
    lines += [f"| {cell(k['name'][:100])} | {k['kind']} | {k['ms_per_step']:.2f} | {k['calls_per_step']:.0f} |"
              for k in profile["top_kernels"]]
    return lines


def profile_section(record: dict[str, Any]) -> list[str]:
    details = record.get("details") or {}
    lines = ["", f"## {record['title']}", ""]
    if not details.get("by_kind_ms_per_step"):
        return [*lines, record["status"]]
    lines += [f"{details['model']}, batch {details['batch']} x {details['seq_length']}, {details['precision']}, "
              f"{details['steps']} profiled steps; {details['timed_on']}. Wall {details['wall_ms_per_step']:.1f} "
              f"ms/step, kernels busy {details['busy_ms_per_step']:.1f} ms/step "
              f"({details['busy_fraction']:.0%}).", "", "| kind | ms/step |", "|---|---|"]
    lines += [f"| {kind} | {ms:.2f} |" for kind, ms in details["by_kind_ms_per_step"].items()]
    lines += ["", "| kernel | kind | ms/step | calls/step |", "|---|---|---|---|"]
    lines += [f"| {cell(k['name'][:100])} | {k['kind']} | {k['ms_per_step']:.2f} | {k['calls_per_step']:.0f} |"
              for k in details["top_kernels"]]
    return lines


def checkpointing_section(record: dict[str, Any]) -> list[str]:
    details = record.get("details") or {}
    lines = ["", f"## {record['title']}", ""]
    if not details.get("results"):
        return [*lines, record["status"]]
    lines += [f"{details['model']}, batch {details['batch']} x {details['seq_length']} tokens, {details['precision']}, "
              f"{details['device']}.", "", "| mode | ms/step | tokens/s | peak allocated GiB | largest batch |",
              "|---|---|---|---|---|"]
    for mode, result in details["results"].items():
        lines.append(f"| {mode} | {result['ms_per_step']:.1f} | {result['tokens_per_s']:,.0f} | "
                     f"{result['peak_allocated_gib']} | {details['largest_batch'].get(mode)} |")
    lines += ["", f"Checkpointed / plain: {details['time_ratio']:.2f}x the step time, "
              f"{details.get('memory_ratio', float('nan')):.2f}x the peak memory."]
    return lines


def first_line(text: str | None, limit: int = 160) -> str:
    if not text:
        return ""
    line = next((x.strip() for x in text.strip().splitlines() if x.strip()), "")
    return line[:limit]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
