"""A real MCP client (the Python MCP SDK from PyPI) driving `nisse mcp serve`
for the end-to-end test in this folder.

It connects over stdio (starting the server itself, as MCP clients do) or
over streamable HTTP (with a bearer token, or without one), lists the
tools, makes the calls read from standard input (a JSON list of
`{"tool": name, "arguments": {...}}`), and prints one JSON report on
standard output: the tools as listed, and each call's result or the
protocol error it got. The Rust test decides what is right; this script
only reports what the server said.

Usage:
  python client.py stdio COMMAND [ARG...]     < calls.json
  python client.py http URL [--token-file FILE] < calls.json
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def tool_entry(tool):
    annotations = tool.annotations
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "read_only": annotations.read_only_hint if annotations else None,
    }


def text_of(result):
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")


async def drive(client, calls):
    report = {"server": None, "tools": [], "calls": []}
    async with client as session:
        info = session.server_info
        report["server"] = info.name if info else None
        listed = await session.list_tools()
        report["tools"] = [tool_entry(t) for t in listed.tools]
        for call in calls:
            entry = {"tool": call["tool"], "arguments": call.get("arguments", {})}
            try:
                result = await session.call_tool(call["tool"], call.get("arguments", {}))
                entry["is_error"] = bool(result.is_error)
                entry["text"] = text_of(result)
                entry["structured"] = result.structured_content
            except MCPError as e:
                entry["protocol_error"] = {"code": e.code, "message": e.message}
            report["calls"].append(entry)
    return report


async def main(argv):
    calls = json.load(sys.stdin)
    if argv[0] == "stdio":
        params = StdioServerParameters(command=argv[1], args=argv[2:])
        return await drive(Client(params), calls)
    if argv[0] == "http":
        url = argv[1]
        headers = {}
        if len(argv) > 3 and argv[2] == "--token-file":
            with open(argv[3], encoding="utf-8") as f:
                headers["Authorization"] = "Bearer " + f.read().strip()
        # Every HTTP status the server answered with, for the report: the
        # SDK turns a refusal into a generic protocol error.
        statuses = []

        async def record(response):
            statuses.append(response.status_code)

        async with create_mcp_http_client(headers=headers) as http:
            http.event_hooks = {"response": [record]}
            try:
                report = await drive(Client(streamable_http_client(url, http_client=http)), calls)
            except Exception as e:  # the report says why the connection failed
                report = {"connect_error": describe(e)}
            report["http_statuses"] = statuses
            return report
    raise SystemExit(f"unknown transport {argv[0]!r}: use `stdio` or `http`")


def describe(e):
    """The error and, for a group of them, every one inside (an HTTP status
    the transport raised comes out of anyio's task group as a group)."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in e.exceptions)
    if isinstance(e, httpx2.HTTPStatusError):
        return f"HTTP {e.response.status_code}: {e}"
    if isinstance(e, MCPError):
        return f"MCPError {e.code}: {e.message}"
    return f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:]))))
