"""Translation of Jupyter IOPub messages into the lines of the `/execute` stream.

The wire format (one JSON object per line) is fixed by the E2B code-interpreter SDKs; the
mapping of MIME types to field names is the SDKs' `Result` model. Anything a kernel sends that
has no field of its own is passed along under `extra`, so no representation is lost.
"""

import datetime

# MIME type -> field of a `result` line.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    # Our own formatters (kernel_setup.py): extracted chart data and DataFrames.
    "e2b/chart": "chart",
    "e2b/data": "data",
}


def timestamp(msg):
    """The Jupyter message's date as ISO-8601 (the Python SDK hands it to callbacks)."""
    date = msg.get("header", {}).get("date")
    if isinstance(date, datetime.datetime):
        return date.isoformat()
    if isinstance(date, str) and date:
        return date
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _plain_text(text):
    # A repr of a string comes back quoted ('abc'); the SDKs expect the bare value, as the
    # reference server gives it. Strip exactly one pair of matching quotes.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def result_line(data, is_main_result):
    """A `result` line from a MIME bundle."""
    line = {"type": "result", "is_main_result": is_main_result}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if value is None:
            continue
        if field is None:
            extra[mime] = value
        elif field == "text":
            line["text"] = _plain_text(value)
        else:
            line[field] = value
    if extra:
        line["extra"] = extra
    return line


def error_line(name, value, traceback):
    """An `error` line; the Python SDK indexes all three fields, so all are strings."""
    if isinstance(traceback, list):
        traceback = "\n".join(traceback)
    return {
        "type": "error",
        "name": name or "",
        "value": value or "",
        "traceback": traceback or "",
    }


def translate(msg):
    """The wire line for one IOPub message of the running execution, or None."""
    kind = msg.get("msg_type")
    content = msg.get("content", {})
    if kind == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return {"type": name, "text": content.get("text", ""), "timestamp": timestamp(msg)}
    if kind == "execute_input":
        return {
            "type": "number_of_executions",
            "execution_count": content.get("execution_count"),
        }
    if kind == "display_data":
        return result_line(content.get("data", {}), False)
    if kind == "execute_result":
        return result_line(content.get("data", {}), True)
    if kind == "error":
        return error_line(
            content.get("ename"), content.get("evalue"), content.get("traceback", [])
        )
    return None
