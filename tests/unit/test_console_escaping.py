"""Every piece of a message reaches the console's pages as text, whatever it holds: header
names and values, bodies, type names and exception text (hypothesis, as the fuzz tests)."""

from __future__ import annotations

import json
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import escape

from endpoint_runtime.console.app import TEMPLATES, _message_view
from endpoint_runtime.console.diagram import diagram

TAGS = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "</pre><b>",
        "<svg onload=alert(1)>", "\"><a href=javascript:x>"]
MARKUP = st.builds(lambda text, tag, more: text + tag + more,
                   st.text(max_size=15), st.sampled_from(TAGS), st.text(max_size=15))
"""Any text around a tag (none of which the templates contain themselves)."""


def _render(template: str, **values: object) -> str:
    return TEMPLATES.get_template(template).render(csrf="c", csrf_field="csrf",
                                                   read_only=False, **values)


@settings(max_examples=60, deadline=None)
@given(name=MARKUP, value=MARKUP, body=MARKUP)
def test_a_message_page_shows_headers_and_body_as_text(name: str, value: str,
                                                       body: str) -> None:
    headers = {name: value, "NServiceBus.EnclosedMessageTypes": value,
               "NServiceBus.ExceptionInfo.Message": value}
    row = {"id": uuid.uuid4(), "headers": json.dumps(headers), "body": body.encode()}
    page = _render("message.html", **_message_view(row))
    for text in (name, value, body):
        assert str(escape(text)) in page
        assert text not in page  # every one holds a tag: it appears escaped only


@settings(max_examples=60, deadline=None)
@given(endpoint=MARKUP, message_type=MARKUP)
def test_a_conversation_shows_endpoint_and_type_names_as_text(endpoint: str,
                                                              message_type: str) -> None:
    drawn = diagram([{"sending_endpoint": endpoint, "processing_endpoint": "b",
                      "message_type": message_type, "intent": "Send", "failed": True,
                      "message_id": "1", "native_id": None}])
    page = _render("conversation.html", conversation_id=endpoint, diagram=drawn)
    assert str(escape(endpoint)) in page
    assert endpoint not in page
    label = drawn.arrows[0].label
    if any(tag in label for tag in TAGS):
        assert label not in page
