"""Two real multi-label tables built from data files that ship inside Debian packages of R
packages (read straight from the ``.deb``; no R, nothing installed).

Each table is written as ONE CSV of fully labelled rows: ``id``, the numeric feature columns
(prefixed ``x_``) and the 0/1 label columns. Run-time needs are the standard library, numpy and
pandas: the ``.deb`` is an ``ar`` archive read with the standard library, its ``data.tar.xz`` with
``tarfile``, and the R ``.rda`` file inside with the small reader of R's XDR serialization below
(:func:`read_rda`). The ``.deb`` comes with ``apt-get download NAME=VERSION`` into ``--packages``
(once; needs ``apt-get update`` to have been run; a ``.deb`` of that name already in the folder is
used as it is).

* ``hobbies`` -- FactoMineR's ``hobbies`` survey (8,403 French respondents; which of 17 leisure
  activities each one practises).
  Package: Debian ``r-cran-factominer`` version ``2.7-1`` (CRAN FactoMineR 2.7), file
  ``usr/lib/R/site-library/FactoMineR/data/hobbies.rda`` (object ``hobbies``, 8,403 x 23).
  Rows: all 8,403 respondents (no sampling). Labels (17): the yes/no hobby questions Reading,
  Listening_music, Cinema, Show, Exhibition, Computer, Sport, Walking, Travelling,
  Playing_music, Collecting, Volunteering, Mechanic, Gardening, Knitting, Cooking, Fishing.
  Features (24): TV (the 18th question, how much television, levels 0..4, kept as the number)
  and one-hot Sex (2), Age band (8), Marital status (5), Profession (7 + ``unknown``).
  Dropped: ``nb.activitees`` (the count of the hobbies, i.e. a function of the labels).
  Missing values: Profession is missing for 1,498 respondents (mostly the youngest and oldest
  age bands); they are kept and imputed as their own one-hot category ``Profession_unknown``;
  no other column has a missing value, no row is dropped.
  Shape: 8,403 rows x 24 features x 17 labels; 5.99 labels per row (92.2 % of rows have more
  than one, 2.3 % none).

* ``nmes`` -- AER's ``NMES1988``: 4,406 US Medicare beneficiaries aged 66 and over from the
  National Medical Expenditure Survey 1987/88 (Deb & Trivedi 1997): which kinds of health care
  each one used in the year.
  Package: Debian ``r-cran-aer`` version ``1.2-10-1`` (CRAN AER 1.2-10), file
  ``usr/lib/R/site-library/AER/data/NMES1988.rda`` (object ``NMES1988``, 4,406 x 19).
  Rows: all 4,406 people (no sampling, no missing values).
  Labels (6): a count above zero of visits (physician office visits), nvisits (non-physician
  office visits), ovisits (physician hospital-outpatient visits), novisits (non-physician
  outpatient visits), emergency (emergency-room visits), hospital (hospital stays).
  Features (18): chronic (number of chronic conditions), age (years / 10), school (years of
  education), income (10,000 USD) as numbers; adl (limited), afam, gender (male), married,
  employed, insurance (private), medicaid as 0/1; one-hot health (poor / average / excellent)
  and region (4). Nothing dropped but the six counts the labels are made from.
  Shape: 4,406 rows x 18 features x 6 labels; 1.93 labels per row (58.5 % of rows have more
  than one, 9.9 % none).

* ``ticdata`` (a spare, not one of the two: its features carry little signal, see below) -- the
  CoIL Challenge 2000 insurance-customer table (van der Putten & van Someren 2000) as kernlab
  ships it: which insurance products each customer holds.
  Package: Debian ``r-cran-kernlab`` version ``0.9-32-1`` (CRAN kernlab 0.9-32), file
  ``usr/lib/R/site-library/kernlab/data/ticdata.rda`` (object ``ticdata``, 9,822 x 86: the
  5,822 training plus 4,000 evaluation customers of the challenge).
  Rows: all 9,822 customers (no sampling, no missing values).
  Labels (10): the customer holds at least one policy (``A<product> > 0``) of the nine products
  held by at least 2 % of customers -- AWAPART (private third-party liability), AWALAND
  (agricultural third-party liability), APERSAUT (car), AMOTSCO (motorcycle/scooter), ATRACTOR
  (tractor), ABROM (moped), ALEVEN (life), ABRAND (fire), AFIETS (bicycle) -- and CARAVAN
  (mobile-home policy, the challenge's target).
  Features (95): the 43 socio-demographic columns, which describe the customer's postcode area:
  MAANTHUI (number of houses) and MGEMOMV (average household size) as numbers; the 38 banded
  columns MGODRK .. MKOOPKLA (ordered factors ``0%`` .. ``100%`` in kernlab) as their level
  index 0..9 (the challenge's own codes); one-hot STYPE (customer subtype, 39 levels present),
  MOSHOOFD (customer main type, 10) and MGEMLEEF (average age band, 6).
  Dropped: the 21 ``P*`` premium columns (kernlab names PVRAAUT's ``AAUT``), which encode the
  very products the labels are made from, and the ``A*`` counts of the 12 products held by under
  2 % of customers (outcomes, not features).
  Shape: 9,822 rows x 95 features x 10 labels; 1.74 labels per row (47.9 % of rows have more
  than one, 11.5 % none). A one-vs-rest logistic regression gets a test macro AP of only 0.21
  against a prior of 0.17 (postcode-level features), hence a spare.

No classic MULAN / MEKA benchmark file (scene, birds, genbase, medical, enron, CAL500, ...) was
found in a package reachable here: the PyPI multi-label libraries looked at (MLCLAS, CTBN, MCML,
multismote, scikit-ptm-fs, pclp, hmc-torch, preorder4mlc, dacaf-mlc, scikit-multilearn-ng,
example-wise-f1-maximizer) ship no data, scikit-multilearn and mldr.datasets download theirs,
Debian has no mldr / utiml, Debian's r-cran-mlr ships only yeast (in use already), and the old
Orange 2.7.8 wheel has only emotions / flags among multi-label sets.

    python build_tables.py --packages packages --out data            # hobbies, nmes
    python build_tables.py --packages packages --out data --sets hobbies,nmes,ticdata

Prints, per table, its shape, labels per row and each label's positive rate.
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import io
import lzma
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

SETS = ("hobbies", "nmes")
SPARE = ("ticdata",)
#: Debian package, exact version, the .rda inside it, the R object in it
SOURCES = {
    "hobbies": ("r-cran-factominer", "2.7-1",
                "usr/lib/R/site-library/FactoMineR/data/hobbies.rda", "hobbies"),
    "ticdata": ("r-cran-kernlab", "0.9-32-1",
                "usr/lib/R/site-library/kernlab/data/ticdata.rda", "ticdata"),
    "nmes": ("r-cran-aer", "1.2-10-1",
             "usr/lib/R/site-library/AER/data/NMES1988.rda", "NMES1988"),
}


# ---- the package file ---------------------------------------------------------------------------
def fetch_deb(package: str, version: str, packages: Path) -> Path:
    """The ``.deb`` of ``package`` at ``version`` in ``packages``, downloaded with apt-get once."""
    pattern = f"{package}_{version.replace(':', '%3a')}_*.deb"
    found = sorted(packages.glob(pattern))
    if found:
        return found[0]
    packages.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", "-q", f"{package}={version}"], cwd=packages,
                   check=True)
    found = sorted(packages.glob(pattern))
    if not found:
        raise FileNotFoundError(f"apt-get download {package}={version} left no {pattern} in "
                                f"{packages}")
    return found[0]


def deb_member(deb: Path, path: str) -> bytes:
    """The bytes of file ``path`` of a ``.deb``'s data archive (an ``ar`` archive holding
    ``data.tar.{xz,gz,bz2}``)."""
    raw = deb.read_bytes()
    if raw[:8] != b"!<arch>\n":
        raise ValueError(f"{deb}: not an ar archive")
    pos = 8
    while pos + 60 <= len(raw):
        header = raw[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = raw[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:  # xz / gz / bz2 by magic
                for m in tar.getmembers():
                    if m.isfile() and m.name.lstrip("./") == path:
                        return tar.extractfile(m).read()
            raise FileNotFoundError(f"{deb}: no {path} in {name}")
    raise FileNotFoundError(f"{deb}: no data.tar member")


# ---- R's .rda files -----------------------------------------------------------------------------
NA_INT = -(2 ** 31)
_PAIRLISTS = (2, 3, 5, 6, 17, 239, 240)  # LISTSXP CLOSXP PROMSXP LANGSXP DOTSXP ATTR{LIST,LANG}SXP


class RObj:
    """An R value: kind (``int``, ``lgl``, ``real``, ``str``, ``list``, ``pairlist``, ...), data,
    and its attributes by name."""

    def __init__(self, kind, data, attrs=None):
        self.kind, self.data, self.attrs = kind, data, attrs or {}

    def classes(self) -> list:
        cls = self.attrs.get("class")
        return list(cls.data) if isinstance(cls, RObj) else []


class _Unserializer:
    """R's XDR serialization format (versions 2 and 3), enough for data frames of atomic
    vectors and factors."""

    def __init__(self, buf: bytes):
        self.buf, self.pos, self.refs = buf, 0, []

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.buf, self.pos)
        self.pos += 4
        return v

    def array(self, dtype: str, n: int) -> np.ndarray:
        v = np.frombuffer(self.buf, dtype, n, self.pos)
        self.pos += v.nbytes
        return v.astype(np.int64 if dtype == ">i4" else np.float64)

    def length(self) -> int:
        n = self.int()
        return (self.int() << 32) + self.int() if n == -1 else n

    @staticmethod
    def attributes(pairlist) -> dict:
        return dict(pairlist.data) if isinstance(pairlist, RObj) else {}

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t == 254:  # NULL
            return None
        if t in (253, 252, 251, 250, 242, 241):  # global/base/empty env, unbound, missing arg
            return RObj("special", t)
        if t == 255:  # reference to an earlier symbol / environment
            idx = flags >> 8
            return self.refs[(idx or self.int()) - 1]
        if t in (247, 248, 249):  # persistent / package / namespace: a string vector
            self.int()
            obj = RObj("namespace", [self.item() for _ in range(self.int())])
            self.refs.append(obj)
            return obj
        if t == 1:  # symbol
            obj = RObj("symbol", None)
            self.refs.append(obj)
            obj.data = self.item()
            return obj
        if t == 4:  # environment
            self.int()
            obj = RObj("env", None)
            self.refs.append(obj)
            obj.data = [self.item() for _ in range(4)]  # enclos, frame, hashtab, attributes
            return obj
        if t in _PAIRLISTS:
            cells, attrs = [], None
            while True:
                attr = self.item() if has_attr else None
                attrs = attrs if attrs is not None else attr
                tag = self.item() if has_tag else None
                cells.append((tag.data if isinstance(tag, RObj) else None, self.item()))
                flags = self.int()
                if flags & 0xFF in _PAIRLISTS:  # the CDR is the next cell
                    has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
                    continue
                self.pos -= 4
                self.item()  # the tail, NULL for a proper list
                break
            return RObj("pairlist", cells, self.attributes(attrs))
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
            self.pos += n
            return s
        if t == 238:  # ALTREP
            info, state, attr = self.item(), self.item(), self.item()
            obj = self.altrep(info.data[0][1].data, state)
            obj.attrs = self.attributes(attr)
            return obj
        if t in (10, 13):
            obj = RObj("lgl" if t == 10 else "int", self.array(">i4", self.length()))
        elif t == 14:
            obj = RObj("real", self.array(">f8", self.length()))
        elif t == 15:
            obj = RObj("cplx", self.array(">f8", 2 * self.length()))
        elif t == 16:
            obj = RObj("str", [self.item() for _ in range(self.length())])
        elif t in (19, 20):
            obj = RObj("list", [self.item() for _ in range(self.length())])
        elif t == 24:
            n = self.length()
            obj = RObj("raw", self.buf[self.pos:self.pos + n])
            self.pos += n
        elif t == 25:
            obj = RObj("s4", None)
        else:
            raise ValueError(f"R type {t} is not supported (byte {self.pos})")
        if has_attr:
            obj.attrs = self.attributes(self.item())
        return obj

    @staticmethod
    def altrep(cls: str, state) -> RObj:
        if cls in ("compact_intseq", "compact_realseq"):
            n, start, step = state.data[:3]
            seq = start + step * np.arange(int(n))
            return RObj("int" if cls == "compact_intseq" else "real",
                        seq.astype(np.int64 if cls == "compact_intseq" else np.float64))
        if cls.startswith("wrap_"):
            return state.data[0]
        if cls == "deferred_string":
            arg = state.data[0][1]
            return RObj("str", [None if arg.kind == "int" and v == NA_INT else
                                str(int(v)) if arg.kind == "int" else repr(float(v))
                                for v in arg.data])
        raise ValueError(f"ALTREP class {cls} is not supported")


def read_rda(raw: bytes) -> dict:
    """The objects of an ``.rda`` file (gzip, bzip2 or xz compressed, XDR), by name."""
    for magic, decompress in ((b"\x1f\x8b", gzip.decompress), (b"BZh", bz2.decompress),
                              (b"\xfd7zXZ\x00", lzma.decompress)):
        if raw.startswith(magic):
            raw = decompress(raw)
    if raw[:5] not in (b"RDX2\n", b"RDX3\n") or raw[5:7] != b"X\n":
        raise ValueError("not an XDR .rda file")
    r = _Unserializer(raw[7:])
    version = r.int()
    r.int(), r.int()  # the writer's R version, the oldest R that reads it
    if version == 3:
        r.pos += r.int()  # the native encoding
    return dict(r.item().data)


def r_to_pandas(obj: RObj):
    """A data.frame as a DataFrame, a factor as a Categorical (NA -> NaN), an int / logical
    vector as int64 (or float64 with NaN where NA), a double vector as float64."""
    cls = obj.classes()
    if obj.kind == "list" and "data.frame" in cls:
        return pd.DataFrame({n: r_to_pandas(c) for n, c in zip(obj.attrs["names"].data,
                                                                  obj.data)})
    if obj.kind == "int" and "factor" in cls:
        codes = np.where(obj.data == NA_INT, -1, obj.data - 1)
        return pd.Categorical.from_codes(codes, categories=obj.attrs["levels"].data,
                                         ordered="ordered" in cls)
    if obj.kind in ("int", "lgl"):
        missing = obj.data == NA_INT
        return np.where(missing, np.nan, obj.data) if missing.any() else obj.data
    if obj.kind == "real":
        return obj.data
    if obj.kind == "str":
        return np.array(obj.data, dtype=object)
    raise ValueError(f"R value of kind {obj.kind} is not supported")


def load_r_table(name: str, packages: Path) -> tuple[pd.DataFrame, str]:
    package, version, path, obj = SOURCES[name]
    deb = fetch_deb(package, version, packages)
    df = r_to_pandas(read_rda(deb_member(deb, path))[obj])
    return df, f"Debian {package} {version}: {path} ({obj})"


def one_hot(df: pd.DataFrame, columns: list[str], missing: str | None = None) -> pd.DataFrame:
    """0/1 columns ``<col>_<level>`` for every level present (levels in R's order); a missing
    value becomes ``<col>_<missing>`` when ``missing`` is given (else it is an error)."""
    out = {}
    for col in columns:
        values = pd.Series(df[col]).astype(object)
        if values.isna().any():
            if missing is None:
                raise ValueError(f"{col} has missing values")
            values = values.where(values.notna(), missing)
        levels = [lv for lv in list(df[col].cat.categories) + [missing] if (values == lv).any()]
        for lv in levels:
            out[safe(f"{col}_{lv}")] = (values == lv).astype(np.float64).to_numpy()
    return pd.DataFrame(out)


def safe(name: str) -> str:
    """A column name of letters, digits and underscores."""
    out = "".join(c if c.isalnum() else "_" for c in str(name))
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_")


# ---- the tables ---------------------------------------------------------------------------------
HOBBIES = ["Reading", "Listening music", "Cinema", "Show", "Exhibition", "Computer", "Sport",
           "Walking", "Travelling", "Playing music", "Collecting", "Volunteering", "Mechanic",
           "Gardening", "Knitting", "Cooking", "Fishing"]


def load_hobbies(packages: Path):
    df, source = load_r_table("hobbies", packages)
    y = pd.DataFrame({safe(c): df[c].astype(int) for c in HOBBIES})
    others = [c for c in df.columns if c not in HOBBIES + ["TV", "Profession", "nb.activitees"]]
    if df[others + ["TV"]].isna().any().any():
        raise ValueError("hobbies: unexpected missing values")
    x = pd.concat([pd.DataFrame({"TV": df["TV"].astype(int).astype(np.float64)}),
                   one_hot(df, ["Sex", "Age", "Marital status"]),
                   one_hot(df, ["Profession"], missing="unknown")], axis=1)
    return x, y, source


TIC_PRODUCTS = ["AWAPART", "AWALAND", "APERSAUT", "AMOTSCO", "ATRACTOR", "ABROM", "ALEVEN",
                "ABRAND", "AFIETS"]
TIC_NOMINAL = ["STYPE", "MOSHOOFD", "MGEMLEEF"]
TIC_NUMERIC = ["MAANTHUI", "MGEMOMV"]


def load_ticdata(packages: Path):
    df, source = load_r_table("ticdata", packages)
    if df.isna().any().any():
        raise ValueError("ticdata: unexpected missing values")
    bands = list(df.columns[df.columns.get_loc("MGODRK"):df.columns.get_loc("MKOOPKLA") + 1])
    if len(bands) != 38 or not all(df[c].cat.ordered for c in bands):
        raise ValueError("ticdata: the 38 percentage bands are not where expected")
    y = pd.DataFrame({c: (df[c] > 0).astype(int) for c in TIC_PRODUCTS})
    y["CARAVAN"] = (df["CARAVAN"] == "insurance").astype(int)
    x = pd.concat([df[TIC_NUMERIC].astype(np.float64),
                   pd.DataFrame({c: df[c].cat.codes.astype(np.float64) for c in bands}),
                   one_hot(df, TIC_NOMINAL)], axis=1)
    return x, y, source


NMES_USE = ["visits", "nvisits", "ovisits", "novisits", "emergency", "hospital"]


def load_nmes(packages: Path):
    df, source = load_r_table("nmes", packages)
    if df.isna().any().any():
        raise ValueError("nmes: unexpected missing values")
    y = pd.DataFrame({c: (df[c] > 0).astype(int) for c in NMES_USE})
    binary = {"adl": "limited", "afam": "yes", "gender": "male", "married": "yes",
              "employed": "yes", "insurance": "yes", "medicaid": "yes"}
    x = pd.concat([df[["chronic", "age", "school", "income"]].astype(np.float64),
                   pd.DataFrame({f"{c}_{v}": (df[c] == v).astype(np.float64)
                                 for c, v in binary.items()}),
                   one_hot(df, ["health", "region"])], axis=1)
    return x, y, source


LOADERS = {"hobbies": load_hobbies, "nmes": load_nmes, "ticdata": load_ticdata}


def build(name: str, packages_dir, out_dir) -> tuple[Path, list[str], list[str]]:
    """Write ``out_dir/<name>.csv`` (``id``, features ``x_*``, 0/1 labels) from the package
    file; return its path, the feature columns and the label columns."""
    x, y, source = LOADERS[name](Path(packages_dir))
    x.columns = [f"x_{c}" for c in x.columns]  # feature names never clash with label names
    if x.isna().any().any() or not np.isfinite(x.to_numpy()).all():
        raise ValueError(f"{name}: non-finite feature values")
    if not set(np.unique(y.to_numpy())) <= {0, 1}:
        raise ValueError(f"{name}: labels are not 0/1")
    table = pd.concat([pd.DataFrame({"id": [f"{name}{i}" for i in range(len(x))]}),
                       x.reset_index(drop=True), y.reset_index(drop=True)], axis=1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.csv"
    table.to_csv(path, index=False)
    return path, list(x.columns), list(y.columns)


def summary(path: Path, features: list[str], labels: list[str]) -> str:
    y = pd.read_csv(path, usecols=labels)[labels].to_numpy()
    card = y.sum(axis=1)
    rates = ", ".join(f"{c} {r:.3f}" for c, r in zip(labels, y.mean(axis=0)))
    return (f"{path}: {len(y)} rows x {len(features)} features x {len(labels)} labels; "
            f"labels per row {card.mean():.3f} (rows with >1 label {np.mean(card > 1):.3f}, "
            f"with none {np.mean(card == 0):.3f})\n  positive rates: {rates}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--packages", default="packages", help="where the .deb files are kept")
    p.add_argument("--out", default="data", help="where the CSV files are written")
    p.add_argument("--sets", default=",".join(SETS),
                   help=f"default {','.join(SETS)}; also {','.join(SPARE)}")
    args = p.parse_args(argv)
    for name in args.sets.split(","):
        print(summary(*build(name, args.packages, args.out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
