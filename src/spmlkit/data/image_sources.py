"""Image dataset sources: the four benchmark sets in their official layouts, the formatted lists of
Cole et al., and two forms for your own images (a CSV file, one folder per class).

Each source lives in its own module (:mod:`~spmlkit.data.voc`, :mod:`~spmlkit.data.coco`,
:mod:`~spmlkit.data.cub`, :mod:`~spmlkit.data.nuswide`, :mod:`~spmlkit.data.cole_images`,
:mod:`~spmlkit.data.csv_images`, :mod:`~spmlkit.data.folder`; what they share is in
:mod:`~spmlkit.data.image_common`); this module imports them all, which registers them, and
re-exports their public names.

Every source returns a :class:`~spmlkit.data.base.Dataset` whose ``pool`` is the official training
set and whose ``test`` is the official evaluation set; ``x`` is a list of **absolute** image paths
(decode them with :func:`spmlkit.data.images.open_image`), ``ids`` the paths relative to the
dataset's image folder, chosen to equal the entries of the official ``formatted_*_images.npy``
lists (``2008_000008.jpg``, ``train2014/COCO_train2014_000000000009.jpg``,
``001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg``). Row order follows the
official formatting scripts (github.com/elijahcole/single-positive-multi-label,
``preproc/format_{pascal,coco,cub}.py``), so the protocol's train / val split
(:func:`~spmlkit.data.base.make_splits`) selects the same images as the papers'.

Sources, the layout each reads, and its pool / test (sizes of the official sets):

``voc``
    ``VOCdevkit/VOC2012/ImageSets/Main/<class>_{train,val}.txt`` and ``JPEGImages/``; 20 classes
    in alphabetical order; label ``1`` is a positive, ``0`` (difficult) and ``-1`` negatives;
    images without a positive dropped; rows sorted by file name. Pool = VOC2012 train (5,717),
    test = VOC2012 val (5,823).
``coco``
    ``annotations/instances_{train,val}2014.json``, ``train2014/``, ``val2014/``; 80 classes in
    the order of the file's ``categories`` (category-id order); images without an annotation
    dropped; rows sorted by image id *as a string* (as ``format_coco.py``). Pool = train2014
    (82,081), test = val2014 (40,137).
``cub``
    ``CUB_200_2011/{images.txt, train_test_split.txt, attributes/image_attribute_labels.txt,
    images/}``, found at any depth (up to 3) below ``root``; 312 attribute labels
    (``is_present``), names from ``attributes.txt``. Pool = ``is_training_image`` 1 (5,994),
    test = 0 (5,794).
``nuswide``
    the published lists of the re-crawl, ``formatted_{train,val}_{images,labels}.npy``, with
    the images in ``Flickr/``; rows without a positive kept, as in the lists. Pool / test = the
    train / val lists (150,000 / 60,260 in the paper's crawl).
``cole_images``
    any dataset folder of Cole et al.: ``formatted_{train,val}_{images,labels}.npy`` (with
    ``formatted_train_labels_obs.npy``, the shipped single-positive draw) and its images.
``csv``
    one row per image: its path, then its class names. Test = a second CSV, else 0.3 of the
    rows (the Cole split, seed 1200, as for yeast).
``folder``
    ``<root>/<class>/<image>``: each image's folder is its only known positive. Test = a
    second tree, else 0.3 of the images (Cole split, seed 1200).

Broken inputs: a missing annotation file raises ``FileNotFoundError`` naming it and the layout
expected; a malformed line raises ``ValueError`` naming the file and line; a missing image raises
``FileNotFoundError`` naming it, unless ``skip_missing=True``, which drops the item; with
``skip_corrupt=True`` every image is decoded once and unreadable ones are dropped too (without it a
corrupt image fails when it is opened, with an error naming it). Dropped items are counted in
``Dataset.meta["skipped"]`` and in one warning. Dropping pool items shifts the rows the protocol
splits, so the train / val split no longer equals the official one (``meta["official_split"]``
is then ``False``).
"""
from __future__ import annotations

from .cole_images import COLE_IMAGE_ROOTS, FORMATTED, load_cole_images
from .coco import COCO_CLASSES, load_coco, read_coco_split
from .csv_images import CSV_HEADERS, CSV_NAME_SEPARATORS, load_csv_images, read_image_csv
from .cub import load_cub, read_cub
from .folder import SPLIT_FOLDER_NAMES, load_folder, scan_class_folders
from .image_common import TAGS, TEST_FRACTION
from .nuswide import load_nuswide
from .voc import VOC_CLASSES, load_voc, read_voc_split

__all__ = ["VOC_CLASSES", "COCO_CLASSES", "TEST_FRACTION", "load_voc", "load_coco", "load_cub",
           "load_nuswide", "load_cole_images", "load_csv_images", "load_folder",
           "read_voc_split", "read_coco_split", "read_cub", "read_image_csv",
           "scan_class_folders", "COLE_IMAGE_ROOTS", "FORMATTED", "CSV_HEADERS",
           "CSV_NAME_SEPARATORS", "SPLIT_FOLDER_NAMES", "TAGS"]
