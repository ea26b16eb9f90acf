"""cut_csv_rows: what a retry's CSVLogger cuts from its file before it appends (the end to
end test, a real fit killed and retried, is tests/tf/test_retries.py)."""

from __future__ import annotations

from gpuhop.runtime.callbacks import cut_csv_rows

HEADER = b"epoch,loss,val_loss\r\n"


def rows(*epochs: int, sep: str = ",") -> bytes:
    """Rows as Keras's CSVLogger writes them (csv's excel dialect ends lines with CRLF)."""
    return "".join(f"{e}{sep}0.5{sep}NA\r\n" for e in epochs).encode()


def test_the_rows_of_the_resumed_epoch_and_later_go(tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(HEADER + rows(0, 1, 2, 3))
    cut_csv_rows(str(log), ",", 2)
    assert log.read_bytes() == HEADER + rows(0, 1)


def test_a_line_a_kill_left_half_written_goes(tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(HEADER + rows(0, 1) + b"2,0.4")
    cut_csv_rows(str(log), ",", 2)
    assert log.read_bytes() == HEADER + rows(0, 1)


def test_an_earlier_fits_rows_in_the_same_file_stay(tmp_path):
    # A first fit of 6 epochs, then the fit now resuming at its 3rd, appending to the file.
    log = tmp_path / "log.csv"
    log.write_bytes(HEADER + rows(0, 1, 2, 3, 4, 5) + rows(0, 1, 2))
    cut_csv_rows(str(log), ",", 2)
    assert log.read_bytes() == HEADER + rows(0, 1, 2, 3, 4, 5) + rows(0, 1)


def test_the_header_stays_and_the_separator_is_the_loggers(tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(b"epoch;loss\n" + rows(3, 4, sep=";"))
    cut_csv_rows(str(log), ";", 1)
    assert log.read_bytes() == b"epoch;loss\n"


def test_a_file_with_nothing_to_cut_is_left_as_it_is(tmp_path):
    log = tmp_path / "log.csv"
    log.write_bytes(HEADER + rows(0, 1))
    before = log.stat()
    cut_csv_rows(str(log), ",", 2)
    assert log.read_bytes() == HEADER + rows(0, 1)
    assert log.stat().st_mtime_ns == before.st_mtime_ns
    cut_csv_rows(str(tmp_path / "absent.csv"), ",", 2)
    assert not (tmp_path / "absent.csv").exists()
