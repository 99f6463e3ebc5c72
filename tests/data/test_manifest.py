"""ImageList and CSV/TSV manifests over real image files: local, HTTP and a moto S3 server.

The reference for every Loader batch is the same files read as an ImageFolder (or a
Subset of one in the manifest's order), so the manifest path must be exact, not close.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset
from torchvision import transforms as tv

from dask_ddp import storage
from dask_ddp.data import ImageFolder, ImageList, Loader
from dask_ddp.data import transforms as T
from images import file_putter, write_folder

CLASSES = ("ant", "bee", "cat")
KINDS = ("jpeg", "png", "jpeg-progressive", "jpeg-gray")
TRAIN = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])
EVAL = T.Compose([T.Resize(28), T.CenterCrop(24), T.ToTensor()])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifest-images")
    write_folder(file_putter(str(root)), CLASSES, 5, kinds=KINDS)
    return root


def collect(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def assert_same_batches(a: Loader, b: Loader) -> None:
    xs, ys = collect(a), collect(b)
    assert len(xs) == len(ys) > 0
    for (xa, la), (xb, lb) in zip(xs, ys, strict=True):
        assert torch.equal(xa, xb) and torch.equal(la, lb)


def write_csv(path: Path, rows: list[list[str]], delimiter: str = ",") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(delimiter.join(r) + "\n" for r in rows))


def shuffled(ds: ImageFolder, seed: int = 0) -> list[int]:
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    return order


# ---- ImageList and ImageFolder are one dataset -------------------------------------------


def test_imagelist_over_the_folders_files_gives_identical_batches(folder: Path) -> None:
    ref = ImageFolder(folder)
    assert isinstance(ref, ImageList)
    keys = [str(Path(p).relative_to(folder)) for p, _ in ref.samples]
    ds = ImageList(folder, keys, ref.targets, classes=ref.classes)
    assert ds.samples == ref.samples and ds.class_to_idx == ref.class_to_idx
    for tf in (TRAIN, EVAL):
        a = Loader(ds, 4, transform=tf, seed=7, num_threads=2)
        b = Loader(ref, 4, transform=tf, seed=7, num_threads=2)
        a.set_epoch(3)
        b.set_epoch(3)
        assert_same_batches(a, b)
    default = ImageList(f"file://{folder}", keys, ref.targets)
    assert default.classes == ["0", "1", "2"] and default.samples == ref.samples


def test_subset_of_an_imagelist_in_the_loader(folder: Path) -> None:
    ref = ImageFolder(folder)
    keys = [str(Path(p).relative_to(folder)) for p, _ in ref.samples]
    ds = ImageList(folder, keys, ref.targets)
    picked = [9, 0, 14, 3, 3, 7]
    a = Loader(Subset(ds, picked), 4, transform=EVAL, shuffle=False)
    b = Loader(Subset(ref, picked), 4, transform=EVAL, shuffle=False)
    assert_same_batches(a, b)
    assert torch.cat([y for _, y in a]).tolist() == [ref.targets[i] for i in picked]


def test_imagelist_in_a_torch_dataloader_with_workers_and_pickled(folder: Path) -> None:
    ref = ImageFolder(folder)
    order = shuffled(ref)
    keys = [str(Path(ref.samples[i][0]).relative_to(folder)) for i in order]
    tf = tv.Compose([tv.Resize(28), tv.CenterCrop(24), tv.ToTensor()])
    ds = ImageList(folder, keys, [ref.targets[i] for i in order], transform=tf)
    ds[0]  # opens the store; pickling must still work
    blob = pickle.dumps(ds)
    assert blob.count(str(folder).encode()) <= 3  # url, root; samples are rebuilt, not sent
    clone = pickle.loads(blob)
    assert clone.samples == ds.samples and clone.imgs is clone.samples
    dl = DataLoader(ds, batch_size=4, num_workers=2)
    images = torch.cat([x for x, _ in dl])
    labels = torch.cat([y for _, y in dl])
    assert labels.tolist() == ds.targets
    ref.transform = tf
    want = torch.stack([ref[i][0] for i in order])
    assert torch.equal(images, want)


def test_imagelist_argument_errors(folder: Path) -> None:
    with pytest.raises(ValueError, match="2 keys but 1 targets"):
        ImageList(folder, ["a.jpg", "b.jpg"], [0])
    with pytest.raises(ValueError, match="no keys"):
        ImageList(folder, [], [])
    with pytest.raises(ValueError, match=r"key 1: key '\.\./x\.jpg' leaves the root"):
        ImageList(folder, ["ant/img_0000.jpg", "../x.jpg"], [0, 0])
    with pytest.raises(ValueError, match="absolute path outside the root"):
        ImageList(folder, ["/etc/passwd"], [0])
    with pytest.raises(ValueError, match="target 0 is -1"):
        ImageList(folder, ["ant/img_0000.jpg"], [-1])
    with pytest.raises(TypeError, match=r"target 0 \('x'"):
        ImageList(folder, ["ant/img_0000.jpg"], ["x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="target 0 is 2 .* 2 classes"):
        ImageList(folder, ["ant/img_0000.jpg"], [2], classes=["a", "b"])
    absolute = ImageList(
        folder, [f"{folder}/./ant/img_0001.png", f"file://{folder}/bee/x.jpg"], np.array([1, 0])
    )
    assert absolute._keys == ["ant/img_0001.png", "bee/x.jpg"] and absolute.targets == [1, 0]


# ---- manifests -----------------------------------------------------------------------------


def test_from_csv_with_class_names_in_manifest_order(folder: Path) -> None:
    ref = ImageFolder(folder)
    order = shuffled(ref, 1)
    rows = [["label", "path", "annotator"]]
    for i in order:
        key = str(Path(ref.samples[i][0]).relative_to(folder))
        rows.append([ref.classes[ref.targets[i]], key, "someone"])
    write_csv(folder / "train.csv", rows)
    ds = ImageList.from_csv(folder / "train.csv")  # root: the manifest's folder
    assert ds.root == str(folder) and ds.manifest_url == str(folder / "train.csv")
    assert ds.classes == sorted(CLASSES) and ds.class_to_idx == ref.class_to_idx
    assert ds.samples == [ref.samples[i] for i in order]
    a = Loader(ds, 4, transform=TRAIN, seed=2)
    b = Loader(Subset(ref, order), 4, transform=TRAIN, seed=2)
    assert_same_batches(a, b)


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_from_csv_with_integer_labels_and_a_separate_root(
    folder: Path, tmp_path: Path, delimiter: str
) -> None:
    ref = ImageFolder(folder)
    lines = ["\ufeffid" + delimiter + "file" + delimiter + "y"]  # a spreadsheet's BOM
    for i, (path, label) in enumerate(ref.samples):
        key = str(Path(path).relative_to(folder))
        key = [key, f"./{key}", path, f"file://{path}"][i % 4]  # all under the root
        lines.append(delimiter.join([str(i), f'"{key}"', f" {label} "]))
        if i == 3:
            lines.append("")  # blank lines are skipped
        if i == 5:
            lines.append(delimiter * 2)  # and rows of empty fields, as spreadsheets write
    manifest = tmp_path / "lists" / "train.tsv"
    manifest.parent.mkdir()
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ds = ImageList.from_csv(
        f"file://{manifest}", folder, key_column="file", label_column="y", delimiter=delimiter
    )
    assert ds.samples == ref.samples and ds.classes == ["0", "1", "2"]
    assert_same_batches(
        Loader(ds, 5, transform=EVAL, shuffle=False), Loader(ref, 5, transform=EVAL, shuffle=False)
    )


def test_from_csv_with_given_classes_keeps_labels_stable(folder: Path, tmp_path: Path) -> None:
    write_csv(
        tmp_path / "val.csv",
        [["path", "label"], ["cat/img_0000.jpg", "cat"], ["ant/img_0002.jpg", "0"]],
    )
    ds = ImageList.from_csv(tmp_path / "val.csv", folder, classes=["ant", "bee", "cat"])
    assert ds.targets == [2, 0] and len(ds.classes) == 3
    img, label = ds[0]
    assert img.mode == "RGB" and label == 2
    write_csv(tmp_path / "val.csv", [["path", "label"], ["a.jpg", "cat"], ["b.jpg", "dog"]])
    with pytest.raises(ValueError, match=r"val\.csv, line 3: bad label 'dog': not one of"):
        ImageList.from_csv(tmp_path / "val.csv", folder, classes=["ant", "bee", "cat"])


BAD_MANIFESTS = {
    "no-key-column": ("file,label\na.jpg,0\n", r"line 1: no column 'path' in the header"),
    "no-label-column": ("path,class\na.jpg,0\n", r"line 1: no column 'label'"),
    "wrong-delimiter": ("path\tlabel\na.jpg\t0\n", r"line 1: .* is delimiter=',' right\?"),
    "empty": ("", r"empty manifest: expected a header line"),
    "blank": ("\n\n", r"empty manifest: expected a header line"),
    "header-only": ("path,label\n", r"empty manifest: a header \['path', 'label'\] but no rows"),
    "negative-label": ("path,label\na.jpg,1\nb.jpg,-1\n", r"line 3: bad label '-1'"),
    "name-among-ints": ("path,label\na.jpg,1\n\nb.jpg,cat\n", r"line 4: bad label 'cat'"),
    "empty-label": ("path,label\na.jpg,cat\nb.jpg,\n", r"line 3: bad label '': empty"),
    "short-row": ("path,label\na.jpg,1\nb.jpg\n", r"line 3: 1 field\(s\), expected at least 2"),
    "dotdot": ("path,label\na.jpg,0\n../secret.jpg,0\n", r"line 3: key '\.\./secret\.jpg' leaves"),
    "inner-dotdot": (
        "path,label\nant/../../x.jpg,0\n",
        r"line 2: key 'ant/\.\./\.\./x.jpg' leaves",
    ),
    "absolute": ("path,label\n/etc/passwd,0\n", r"line 2: key '/etc/passwd' is an absolute path"),
    "other-url": ("path,label\ns3://other/x.jpg,0\n", r"line 2: key 's3://other/x\.jpg' is a URL"),
    "empty-key": ("path,label\n,0\n", r"line 2: empty key"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifests_name_the_url_and_line(tmp_path: Path, case: str) -> None:
    text, message = BAD_MANIFESTS[case]
    path = tmp_path / f"{case}.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        ImageList.from_csv(path)
    assert str(path) in str(info.value)


def test_missing_manifest_and_missing_images(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        ImageList.from_csv(tmp_path / "nope.csv", folder)
    with pytest.raises(ValueError, match="names no file"):
        ImageList.from_csv("s3://just-a-bucket")
    ref = ImageFolder(folder)
    real = [str(Path(ref.samples[i][0]).relative_to(folder)) for i in (0, 4, 5)]
    rows = [["path", "label"], [real[0], "0"], [real[1], "0"], ["ant/gone_1.jpg", "0"]]
    rows += [[real[2], "1"], ["cat/gone_2.jpg", "2"]]
    write_csv(tmp_path / "stale.csv", rows)
    ds = ImageList.from_csv(tmp_path / "stale.csv", folder)
    with pytest.raises(FileNotFoundError, match=f"{folder}/ant/gone_1.jpg"):
        ds[2]  # never an empty image
    with pytest.raises(FileNotFoundError, match=f"{folder}/ant/gone_1.jpg"):
        list(Loader(ds, 2, transform=EVAL, shuffle=False))
    skip = Loader(ds, 2, transform=EVAL, shuffle=False, on_error="skip")
    labels = torch.cat([y for _, y in skip])
    assert labels.tolist() == [0, 0, 1] and skip.skipped == 2


# ---- other stores ---------------------------------------------------------------------------


def test_manifest_over_http_needs_no_listing_file(
    folder: Path, http_server: tuple[str, Path]
) -> None:
    base, served = http_server
    ref = ImageFolder(folder)
    rows = [["path", "label"]]
    for path, label in ref.samples:
        key = str(Path(path).relative_to(folder))
        file_putter(str(served / "manifest-images"))(key, Path(path).read_bytes())
        rows.append([key, ref.classes[label]])
    write_csv(served / "lists" / "train.csv", rows)
    ds = ImageList.from_csv(f"{base}/lists/train.csv", f"{base}/manifest-images")
    assert ds.samples[0][0] == f"{base}/manifest-images/{rows[1][0]}"
    assert_same_batches(
        Loader(ds, 6, transform=TRAIN, seed=1), Loader(ref, 6, transform=TRAIN, seed=1)
    )
    write_csv(served / "lists" / "stale.csv", rows[:3] + [["ant/gone.jpg", "ant"]] + rows[3:])
    stale = ImageList.from_csv(f"{base}/lists/stale.csv", f"{base}/manifest-images")
    with pytest.raises(FileNotFoundError, match=f"{base}/manifest-images/ant/gone.jpg"):
        list(Loader(stale, 6, transform=EVAL, shuffle=False))
    skip = Loader(stale, 6, transform=EVAL, shuffle=False, on_error="skip")
    assert torch.cat([y for _, y in skip]).tolist() == ref.targets and skip.skipped == 1


@pytest.mark.s3
def test_manifests_in_s3(folder: Path, s3_bucket: str) -> None:
    ref = ImageFolder(folder)
    s3 = storage.open(f"s3://{s3_bucket}")
    keys = [str(Path(p).relative_to(folder)) for p, _ in ref.samples]
    for key, (path, _) in zip(keys, ref.samples, strict=True):
        s3.put(f"images/{key}", Path(path).read_bytes())
    names = [ref.classes[t] for t in ref.targets]
    # 1. next to the images (root: the manifest's folder), class names
    s3.put(
        "images/train.csv",
        ("path,label\n" + "".join(f"{k},{n}\n" for k, n in zip(keys, names, strict=True))).encode(),
    )
    # 2. elsewhere, TSV of full s3:// URLs and integer labels, plus a stale line
    s3.put(
        "lists/train.tsv",
        (
            "path\tlabel\n"
            + "".join(
                f"s3://{s3_bucket}/images/{k}\t{t}\n"
                for k, t in zip(keys, ref.targets, strict=True)
            )
            + f"s3://{s3_bucket}/images/ant/removed.jpg\t0\n"
        ).encode(),
    )
    by_names = ImageList.from_csv(f"s3://{s3_bucket}/images/train.csv")
    by_urls = ImageList.from_csv(
        f"s3://{s3_bucket}/lists/train.tsv", f"s3://{s3_bucket}/images", delimiter="\t"
    )
    assert by_names.samples[0] == (f"s3://{s3_bucket}/images/{keys[0]}", 0)
    assert by_urls._keys[:-1] == by_names._keys == keys
    assert_same_batches(
        Loader(by_names, 4, transform=TRAIN, seed=5), Loader(ref, 4, transform=TRAIN, seed=5)
    )
    with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/images/ant/removed.jpg"):
        list(Loader(by_urls, 4, transform=EVAL, shuffle=False))
    skip = Loader(by_urls, 4, transform=EVAL, shuffle=False, on_error="skip")
    assert torch.cat([y for _, y in skip]).tolist() == ref.targets and skip.skipped == 1
    tf = tv.Compose([tv.Resize(28), tv.CenterCrop(24), tv.ToTensor()])
    by_names.transform = tf
    ref.transform = tf
    dl = DataLoader(Subset(by_names, [0, 7, 14]), batch_size=3, num_workers=2)
    ((images, labels),) = list(dl)
    assert torch.equal(images, torch.stack([ref[i][0] for i in (0, 7, 14)]))
    assert labels.tolist() == [ref.targets[i] for i in (0, 7, 14)]
