"""``offramp prepare MODEL``: turn a zoo model, an ONNX file or a torch model into an
early-exit model (ramp sites, ramp training, block export) and register it in the store."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from services.common import config as config_mod


def register(sub: argparse._SubParsersAction) -> None:
    prep = sub.add_parser("prepare", help="turn a zoo model, an ONNX file or a torch model into "
                          "an early-exit model (ramp sites, ramp training, block export)")
    prep.add_argument("model", help="zoo name, or a path: model.onnx, a TorchScript / pickled "
                      "torch module file, or a Hugging Face model folder")
    prep.add_argument("--data", help="bootstrap inputs: .npz with one array per input name "
                      "(first axis = samples), or .npy for a single input (with "
                      "--no-bootstrap: a few inputs for shapes and timing)")
    prep.add_argument("--name", help="name to serve the model under (default: the zoo name or "
                      "the file stem); e.g. to keep an untrained copy beside a zoo model")
    prep.add_argument("--json", help="write the sites found and the trained ramps to this file")
    prep.add_argument("--sites", help="restrict ramps to these feasible sites: comma list of "
                      "tensor names or site ordinals")
    prep.add_argument("--max-ramps", type=int, default=0,
                      help="most ramps to train (evenly spaced over the sites); default per model")
    prep.add_argument("--bootstrap-n", type=int, help="bootstrap samples (default per model)")
    prep.add_argument("--mask-input", help="text models: the input whose real tokens ramps "
                      "average over (default: an integer input named *mask* beside the ids); "
                      "none = plain mean over every position")
    prep.add_argument("--ramp-targets",
                      help="what ramps learn of the final model: top1, or softmax "
                      "(distillation, sharpened at temperature 0.5); default per model "
                      "(minilm-topics: softmax, others: top1)")
    prep.add_argument("--no-bootstrap", dest="bootstrap", action="store_false",
                      help="no bootstrap data: ramps are built and costed but untrained (zero "
                      "heads) and inactive until the live refit trains them")
    prep.add_argument("--force", action="store_true", help="rebuild even if an intact copy exists")
    prep.add_argument("--models-dir")
    prep.add_argument("--no-store", action="store_true", help="do not record it in the store")
    prep.add_argument("--quiet", action="store_true")
    prep.set_defaults(fn=run)


def run_supernet(args: argparse.Namespace, cfg, say) -> int:
    """A supernet: trained, pareto-profiled and registered with its variant profiles."""
    from services.launcher.supervisor import register_prepared
    from services.prepare.supernet import prepare_configured
    from services.store.migrate import upgrade
    from services.store.repository import Store

    path = prepare_configured(cfg, args.force, say,
                              Path(args.models_dir) if args.models_dir else None, args.model)
    if not args.no_store:
        cfg.home.mkdir(parents=True, exist_ok=True)
        upgrade(cfg.database_url)
        with Store(cfg.database_url) as store:
            register_prepared(store, path, cfg.ramp_budget)
    print(path)
    return 0


def run_llm(args: argparse.Namespace, cfg, say) -> int:
    """A generative model's exit heads: distilled and evaluated, not (yet) registered."""
    from services.prepare.llm_models import prepare_llm
    from services.runtime.llm_manifest import LlmManifest
    from services.zoo.smollm2 import WheelMissing

    try:
        path = prepare_llm(args.model, cfg, args.force, say,
                           Path(args.models_dir) if args.models_dir else None)
    except WheelMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    manifest = LlmManifest.load(path)
    if not args.quiet:
        print(llm_table(manifest), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(manifest.to_dict(), indent=1) + "\n")
    if not args.no_store:
        from services.launcher.supervisor import register_prepared
        from services.store.migrate import upgrade
        from services.store.repository import Store

        cfg.home.mkdir(parents=True, exist_ok=True)
        upgrade(cfg.database_url)
        with Store(cfg.database_url) as store:
            register_prepared(store, path, cfg.ramp_budget)
        say(f"store: {manifest.name} is a HELIOS repository candidate ({cfg.database_url})")
    print(path)
    return 0


def llm_table(manifest, thresholds: tuple[float, ...] = (0.5, 0.8, 0.9)) -> str:
    """Each exit head's held-out agreement with the full model's top-1, per text kind, and
    its coverage / agreement at a few confidence thresholds."""
    kinds = [k for k in manifest.heads[0]["agreement"] if k != "all"] if manifest.heads else []
    title = (f"{manifest.name}: {len(manifest.heads)} exit heads (rank {manifest.head_rank}) "
             f"on {manifest.n_layers} layers; held-out top-1 agreement with the full model")
    header = (f"  {'layer':>5} {'untrained':>9} {'all':>6} " + " ".join(f"{k:>6}" for k in kinds)
              + "".join(f"  {'cov/agr @' + str(t):>16}" for t in thresholds))
    lines = [title, header]
    for h in manifest.heads:
        rows = {r["t"]: r for r in h["thresholds"]}
        cells = []
        for t in thresholds:
            r = rows.get(t)
            cov = r["coverage"]["all"] if r else None
            agr = r["agreement"]["all"] if r else None
            cells.append(f"  {_pct(cov):>7}/{_pct(agr):>8}")
        lines.append(f"  {h['layer']:>5} {_pct(h.get('untrained_agreement')):>9} "
                     f"{_pct(h['agreement']['all']):>6} "
                     + " ".join(f"{_pct(h['agreement'][k]):>6}" for k in kinds) + "".join(cells))
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def run(args: argparse.Namespace) -> int:
    from services.launcher.supervisor import register_prepared
    from services.prepare.pipeline import SUPERNETS, SiteChoice, prepare, sites_json
    from services.runtime.manifest import Manifest
    from services.store.migrate import upgrade
    from services.store.repository import Store
    from services.zoo.registry import LLMS

    cfg = config_mod.load()
    choice = SiteChoice(tuple(s.strip() for s in (args.sites or "").split(",") if s.strip()),
                        args.max_ramps)
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if args.model in SUPERNETS:
        return run_supernet(args, cfg, say)
    if args.model in LLMS:
        return run_llm(args, cfg, say)
    try:
        path = prepare(args.model, Path(args.models_dir) if args.models_dir else cfg.models_dir,
                       force=args.force, log=say, progress=say,
                       data=Path(args.data) if args.data else None, name=args.name,
                       bootstrap_n=args.bootstrap_n, device=cfg.device, threads=cfg.ort_threads,
                       choice=choice, mask_input=args.mask_input,
                       ramp_targets=args.ramp_targets, bootstrap=args.bootstrap)
    except ValueError as exc:  # SourceError and unknown zoo names
        print(f"error: {exc}", file=sys.stderr)
        return 2
    manifest = Manifest.load(path)
    report = sites_json(manifest)
    if not args.quiet:
        print(ramp_table(manifest, report), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if not args.no_store:
        cfg.home.mkdir(parents=True, exist_ok=True)
        upgrade(cfg.database_url)
        store = Store(cfg.database_url)
        try:
            register_prepared(store, path, cfg.ramp_budget)
        finally:
            store.close()
    print(path)
    return 0


def ramp_table(manifest, report: dict) -> str:
    untrained = "" if manifest.bootstrap else " (untrained: no bootstrap data)"
    lines = [(f"{manifest.name}: {len(report['sites'])} feasible ramp sites, "
              f"{len(manifest.ramps)} ramps{untrained}; full model {manifest.full_ms:.3f} ms at "
              f"batch 1, {manifest.base_params:,} params"),
             (f"  {'ramp':>4} {'site':>4}  {'tensor':<44} {'agreement':>9} {'cost ms':>8} "
              f"{'% blocks':>8} {'% unsplit':>9} {'% @b16':>7} {'params %':>8} {'serve ms':>8} "
              f"{'% unspl':>7}")]
    for r in report["ramps"]:
        lines.append(f"  {r['ramp']:>4} {r['site']:>4}  {r['tensor'][-44:]:<44} "
                     f"{_agreement(r):>9} {r['cost_ms']:>8.4f} "
                     f"{100 * (r['cost_share'] or 0):>7.2f}% "
                     f"{100 * (r['cost_share_unsplit'] or 0):>8.2f}% "
                     f"{100 * (r['cost_share_unsplit_b16'] or 0):>6.2f}% "
                     f"{100 * (r['params_share'] or 0):>7.2f}% "
                     f"{r.get('serve_ms') or 0:>8.3f} "
                     f"{100 * (r.get('serve_share_unsplit') or 0):>6.2f}%")
    lines.append("  (cost: the ramp head, fused into its block; % blocks: of the chained blocks at "
                 "batch 1; % unsplit: of the unsplit model at batch 1; % @b16: the same at batch "
                 "16; serve: what activating the ramp adds to a worker's stage at batch 1 - "
                 "its share of what every tapped head adds to the one tapped call, in proportion "
                 "to its cost, or the split there plus the head where taps are unavailable - "
                 "and its share of the unsplit model)")
    return "\n".join(lines)


def _agreement(ramp: dict) -> str:
    if not ramp.get("trained", True) or ramp["agreement"] is None:
        return "untrained"
    return f"{ramp['agreement']:.3f}"
