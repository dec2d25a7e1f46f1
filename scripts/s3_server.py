#!/usr/bin/env python3
"""A small S3 server for the test broker's storage, on the Python standard library alone.

scripts/services/kafka.sh runs Tansu (the Kafka-protocol test broker) on its S3 storage engine
with this server behind it, so a SIGKILLed broker comes back with its topics, records and
group offsets. Tansu's prebuilt binary has no file or SQLite engine, and moto (an S3
emulator from PyPI) took minutes to install.

It serves what Tansu's object store client (the Rust `object_store` crate) asks, path
style (`/bucket/key`), without checking signatures:
  PUT /bucket                          create a bucket
  PUT /bucket/key                      store an object; `If-None-Match: *` and `If-Match:
                                       <etag>` are honoured (412 when they fail), as is a
                                       copy (`x-amz-copy-source`)
  GET, HEAD /bucket/key                an object (`Range: bytes=a-b`, `If-Match`,
                                       `If-None-Match`), with its ETag and Last-Modified
  DELETE /bucket/key                   delete an object
  POST /bucket?delete                  delete many (DeleteObjects)
  GET /bucket?list-type=2              list (prefix, delimiter, start-after,
                                       continuation-token, max-keys)
  GET /                                answers 200 (a readiness probe)
Anything else (multipart uploads) is answered 501. Objects live in memory: they outlive
the broker, not this server.

Usage: s3_server.py HOST PORT
"""

import hashlib
import re
import sys
import threading
import time
import urllib.parse
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape, unescape

LOCK = threading.Lock()
# bucket -> key -> (body, etag, modified seconds)
BUCKETS = {}


def iso(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(seconds))


def etag_matches(header, etag):
    return header is not None and (header.strip() == "*" or etag in [t.strip() for t in header.split(",")])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def split(self):
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.lstrip("/").split("/", 1)
        bucket = urllib.parse.unquote(parts[0])
        key = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
        return bucket, key, urllib.parse.parse_qs(url.query, keep_blank_values=True)

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, status, body=b"", headers=(), content_type="application/xml"):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if body or status not in (204, 304):
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code):
        xml = f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{code}</Message></Error>"
        self.answer(status, xml.encode())

    def objects(self, bucket):
        found = BUCKETS.get(bucket)
        if found is None:
            self.error(404, "NoSuchBucket")
        return found

    def do_PUT(self):
        bucket, key, _ = self.split()
        data = self.body()
        with LOCK:
            if not key:
                BUCKETS.setdefault(bucket, {})
                return self.answer(200)
            objects = self.objects(bucket)
            if objects is None:
                return None
            source = self.headers.get("x-amz-copy-source")
            if source:
                src_bucket, _, src_key = urllib.parse.unquote(source).lstrip("/").partition("/")
                found = BUCKETS.get(src_bucket, {}).get(src_key)
                if found is None:
                    return self.error(404, "NoSuchKey")
                data = found[0]
            current = objects.get(key)
            if self.headers.get("If-None-Match", "").strip() == "*" and current is not None:
                return self.error(412, "PreconditionFailed")
            if_match = self.headers.get("If-Match")
            if if_match is not None and (current is None or not etag_matches(if_match, current[1])):
                return self.error(412 if current is not None else 404, "PreconditionFailed")
            etag = '"' + hashlib.md5(data).hexdigest() + '"'
            now = time.time()
            objects[key] = (data, etag, now)
        if source:
            xml = f"<CopyObjectResult><LastModified>{iso(now)}</LastModified><ETag>{escape(etag)}</ETag></CopyObjectResult>"
            return self.answer(200, xml.encode(), [("ETag", etag)])
        return self.answer(200, b"", [("ETag", etag)])

    def do_GET(self):
        bucket, key, query = self.split()
        if not bucket:
            return self.answer(200, b"<ListAllMyBucketsResult/>")
        if not key:
            return self.list(bucket, query)
        with LOCK:
            objects = self.objects(bucket)
            if objects is None:
                return None
            found = objects.get(key)
        if found is None:
            return self.error(404, "NoSuchKey")
        data, etag, modified = found
        if "If-Match" in self.headers and not etag_matches(self.headers["If-Match"], etag):
            return self.error(412, "PreconditionFailed")
        if etag_matches(self.headers.get("If-None-Match"), etag):
            return self.answer(304, b"", [("ETag", etag)])
        headers = [("ETag", etag), ("Last-Modified", formatdate(modified, usegmt=True)), ("Accept-Ranges", "bytes")]
        status = 200
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if ranged and data:
            first, last = ranged.groups()
            if first == "":
                start, end = max(len(data) - int(last), 0), len(data) - 1
            else:
                start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
            if start > end:
                return self.error(416, "InvalidRange")
            headers.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
            data, status = data[start : end + 1], 206
        return self.answer(status, data, headers, "application/octet-stream")

    do_HEAD = do_GET

    def do_DELETE(self):
        bucket, key, _ = self.split()
        with LOCK:
            BUCKETS.get(bucket, {}).pop(key, None)
        self.answer(204)

    def do_POST(self):
        bucket, _, query = self.split()
        data = self.body()
        if "delete" not in query:
            return self.error(501, "NotImplemented")
        entities = {"&quot;": '"', "&apos;": "'"}
        keys = [unescape(k, entities) for k in re.findall(r"<Key>(.*?)</Key>", data.decode(), re.S)]
        with LOCK:
            objects = BUCKETS.get(bucket, {})
            for key in keys:
                objects.pop(key, None)
        deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
        self.answer(200, f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><DeleteResult>{deleted}</DeleteResult>".encode())

    def list(self, bucket, query):
        one = lambda name, default="": query.get(name, [default])[0]
        prefix, delimiter = one("prefix"), one("delimiter")
        after = max(one("start-after"), one("continuation-token"))
        limit = int(one("max-keys", "1000") or 1000)
        with LOCK:
            objects = self.objects(bucket)
            if objects is None:
                return None
            keys = sorted(k for k in objects if k.startswith(prefix) and k > after)
            contents, prefixes, last, truncated = [], [], "", False
            for key in keys:
                if len(contents) + len(prefixes) >= limit:
                    truncated = True
                    break
                rest = key[len(prefix) :]
                if delimiter and delimiter in rest:
                    common = prefix + rest.split(delimiter, 1)[0] + delimiter
                    if common not in prefixes:
                        prefixes.append(common)
                    last = key
                    continue
                data, etag, modified = objects[key]
                contents.append(
                    f"<Contents><Key>{escape(key)}</Key><LastModified>{iso(modified)}</LastModified>"
                    f"<ETag>{escape(etag)}</ETag><Size>{len(data)}</Size><StorageClass>STANDARD</StorageClass></Contents>"
                )
                last = key
        if truncated and delimiter and prefixes and last.startswith(prefixes[-1]):
            # Skip the rest of the last common prefix on the next page.
            last = prefixes[-1] + "\U0010ffff"
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents) + len(prefixes)}</KeyCount>"
            f"<MaxKeys>{limit}</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
            + (f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else "")
            + "".join(contents)
            + "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
            + "</ListBucketResult>"
        )
        self.answer(200, xml.encode())


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    server = ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
