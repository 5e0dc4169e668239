"""NUS-WIDE as a dataset source (``nuswide``): the published lists of the authors' re-crawl,
``formatted_{train,val}_{images,labels}.npy``, with the images in ``Flickr/``; rows without a
positive kept, as in the lists. Pool / test = the train / val lists (150,000 / 60,260 in the
paper's crawl). Read by `spmlkit.data.cole_images.load_formatted`.
"""
from __future__ import annotations

import os
from pathlib import Path

from .cole_images import load_formatted
from .protocol import Dataset
from .image_common import COLE, TAGS
from .registry import register

__all__ = ["load_nuswide"]


@register("nuswide", "NUS-WIDE images with the published formatted lists (formatted_{train,val}_"
          "{images,labels}.npy) and Flickr/; 81 concepts; rows without a positive kept",
          paper="Chua et al. 2009; " + COLE, tags=TAGS)
def load_nuswide(root: str | os.PathLike, image_root: str | os.PathLike | None = None,
                 observed: str | None = "uniform", class_names=None,
                 drop_empty: bool = False, skip_missing: bool = False,
                 skip_corrupt: bool = False) -> Dataset:
    """NUS-WIDE as published for SPML: the authors re-crawled the images, so the sets are the
    formatted lists they distribute (``formatted_{train,val}_images.npy``: paths relative to
    ``Flickr/``; ``formatted_{train,val}_labels.npy``: 0/1 over the 81 concepts), read with
    the images unpacked from ``Flickr.zip`` into ``<root>/Flickr``.

    Rows without a positive are **kept** by default, as in the official lists (the protocol
    gives them no observed positive, docs/spec.md#regimes; they remain negatives for every class
    at evaluation); ``drop_empty=True`` drops them. Images of the lists that a local copy of
    ``Flickr.zip`` lacks can be dropped and counted with ``skip_missing=True``.

    Args:
        root: the folder with ``formatted_{train,val}_{images,labels}.npy`` (the official
            repository's ``data/nuswide``).
        image_root: the folder the listed paths are relative to (default ``<root>/Flickr``).
        observed: the shipped observed labels to use (``"uniform"``, or ``None`` to draw them
            by the protocol), as the ``cole_images`` source.
        class_names: the 81 concept names (list or file); default ``class_names.txt`` in the
            folder, else ``class{j}``.
        drop_empty: drop rows without a positive (kept by default, as in the official lists).
        skip_missing, skip_corrupt: drop and count unusable images instead of raising.

    Raises:
        FileNotFoundError, ValueError: as `load_cole_images`.
    """
    return load_formatted(Path(root), "nuswide", image_root, observed, class_names,
                          drop_empty, skip_missing, skip_corrupt, "nuswide")
