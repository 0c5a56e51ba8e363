"""Unit tests of the Jupyter-message -> wire-line translation (no kernel needed)."""

import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from warren_interp import output  # noqa: E402


def msg(kind, content, date=None):
    return {"msg_type": kind, "content": content, "header": {"date": date} if date else {}}


def test_stream_lines_keep_their_stream_and_text():
    line = output.translate(msg("stream", {"name": "stderr", "text": "oops\n"}, "2030-01-01T00:00:00Z"))
    assert line == {"type": "stderr", "text": "oops\n", "timestamp": "2030-01-01T00:00:00Z"}
    # Anything that is not stderr is stdout.
    assert output.translate(msg("stream", {"name": "weird", "text": "x"}))["type"] == "stdout"


def test_a_datetime_header_becomes_iso_and_a_missing_one_is_now():
    when = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert output.timestamp({"header": {"date": when}}) == when.isoformat()
    now = datetime.datetime.fromisoformat(output.timestamp({}))
    assert abs((now - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) < 60


def test_the_execution_count_is_its_own_line():
    assert output.translate(msg("execute_input", {"execution_count": 7})) == {
        "type": "number_of_executions", "execution_count": 7}


def test_results_map_mime_types_to_fields_and_keep_the_rest_under_extra():
    data = {"text/plain": "'abc'", "image/png": "iVBOR", "e2b/chart": {"type": "line"},
            "application/x-custom": {"k": 1}, "text/html": None}
    line = output.translate(msg("execute_result", {"data": data}))
    assert line == {"type": "result", "is_main_result": True, "text": "abc", "png": "iVBOR",
                    "chart": {"type": "line"}, "extra": {"application/x-custom": {"k": 1}}}
    shown = output.translate(msg("display_data", {"data": {"text/markdown": "# hi"}}))
    assert shown == {"type": "result", "is_main_result": False, "markdown": "# hi"}


def test_only_one_pair_of_matching_quotes_is_stripped():
    assert output.result_line({"text/plain": "\"'x'\""}, True)["text"] == "'x'"
    assert output.result_line({"text/plain": "'x\""}, True)["text"] == "'x\""
    assert output.result_line({"text/plain": "'"}, True)["text"] == "'"


def test_errors_always_carry_three_strings():
    line = output.translate(msg("error", {"ename": "ZeroDivisionError", "evalue": None,
                                          "traceback": ["a", "b"]}))
    assert line == {"type": "error", "name": "ZeroDivisionError", "value": "", "traceback": "a\nb"}
    assert output.error_line(None, None, None) == {"type": "error", "name": "", "value": "",
                                                   "traceback": ""}


def test_messages_without_a_wire_line_are_dropped():
    for kind in ("status", "clear_output", "comm_open", None):
        assert output.translate(msg(kind, {})) is None
