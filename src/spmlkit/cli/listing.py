"""``spml list``: the registries' entries."""
from __future__ import annotations


def cmd_list(args) -> int:
    if args.names and args.what != "datasets":
        raise ValueError(f"names after 'spml list {args.what}' are for datasets only "
                         f"(spml list datasets NAME --details), got {' '.join(args.names)}")
    if args.what == "datasets" and (args.details or args.names):
        from ..data import DATASETS
        from ..data.options import format_options
        from ..loading import feature_option_rows

        names = args.names or DATASETS.names()
        for name in names:
            DATASETS.get(name)  # an unknown name: the registry's error, with suggestions
        print("\n\n".join(format_options(name, feature_rows=feature_option_rows())
                          for name in names))
        print("\n(give options as --data KEY=VALUE to spml train / benchmark / extract, under "
              "a study's datasets: [{name: ..., options: {...}}], or as keywords to "
              "spmlkit.loading.load_splits)")
        return 0
    if args.what == "losses":
        from ..losses import LOSSES

        rows = [(e.name + (f" ({', '.join(e.aliases)})" if e.aliases else ""), e.description,
                 e.paper) for e in LOSSES.entries()]
    elif args.what == "datasets":
        from ..data import DATASETS

        rows = [(e.name, e.description, e.paper) for e in DATASETS.entries()]
    elif args.what == "methods":
        from ..methods import list_methods

        rows = [(m.name, f"{m.description} (inputs: {m.inputs}"
                 f"{' or feature vectors' if m.accepts_vectors else ''}; options: "
                 f"{', '.join(sorted(m.options)) or 'none'})", m.paper) for m in list_methods()]
    elif args.what == "backbones":
        from ..models.backbones import BACKBONES, list_backbones

        papers = {e.name: e.paper for e in BACKBONES.entries()}
        rows = [(name, desc, papers.get(name, "")) for name, desc in list_backbones()]
    elif args.what == "metrics":
        from ..metrics import METRICS

        rows = [(m.name, f"{m.description} ({'higher' if m.higher_is_better else 'lower'} "
                         f"is better)", "") for m in METRICS.values()]
    else:
        from ..labels import REGIMES

        rows = [(name, desc, "") for name, desc in REGIMES.items()]
    if args.markdown:  # the README's tables are generated this way
        singular = {"losses": "loss", "datasets": "dataset", "regimes": "regime",
                    "backbones": "backbone", "methods": "method",
                    "metrics": "metric"}[args.what]
        print(f"| {singular} | paper | description |\n|---|---|---|")
        for name, desc, paper in rows:
            print(f"| `{name}` | {paper} | {desc.replace('|', '/')} |")
        return 0
    width = max((len(r[0]) for r in rows), default=0)
    for name, desc, _ in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def register(sub) -> None:
    """Add the command's parser to ``sub`` (``spml``'s subparsers)."""
    p = sub.add_parser("list",
                       help="list registered losses, training methods, datasets, regimes, "
                       "backbones or metrics")
    p.add_argument("what", choices=["losses", "methods", "datasets", "regimes", "backbones",
                                    "metrics"])
    p.add_argument("names", nargs="*", default=[], metavar="NAME",
                   help="datasets: only these, with --details implied")
    p.add_argument("--details", action="store_true",
                   help="datasets: every option of each source (--data KEY=VALUE) with its "
                        "type, default and meaning, from the source's signature and docstring")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (for docs)")
    p.set_defaults(func=cmd_list)
