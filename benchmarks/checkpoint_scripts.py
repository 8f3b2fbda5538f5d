"""The processes the checkpoint benchmark times inside the cell's CPU shape, as Python
sources each run by `python -c` (checkpoint.py's docstring tells what each does): ours'
DRIVER, the supervisor's checkpoint in a process of its own, and the streaming baseline's
UPLOADER with the pipeline that feeds it.
"""

MIB = 1024 * 1024
PART_BYTES = 16 * MIB  # the streaming baseline's parts
PART_STREAMS = 4  # its parts in flight at once

# The supervisor's checkpoint in a process of its own (see the module docstring). One JSON
# line out after the capture, one in (the presigned PUT) on stdin, one out at the end; out
# through a descriptor of their own (argv[5]), so nothing a module prints gets in the way.
DRIVER = r"""
import json, os, re, resource, sys, time
from pathlib import Path

import seedkeeper_task.supervisor  # the modules a supervisor holds while it waits
from seedkeeper_task import capture as module
from seedkeeper_task.settings import TaskSettings
from seedkeeper_task.watch import MAX_CHECKPOINT_BYTES

def status(name):
    with open("/proc/self/status") as file:
        return int(re.search(name + r":\s+(\d+) kB", file.read()).group(1))

def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime

steps = {}
def timed(name, function):
    def wrapper(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            steps[name] = steps.get(name, 0.0) + time.perf_counter() - begun
    return wrapper

module._mksquashfs = timed("mksquashfs", module._mksquashfs)
module._seal_and_hash = timed("hash (sha256, md5)", module._seal_and_hash)
resident = status("VmRSS")
try:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM from here on: the footprint plus the checkpoint's peak
    reset = True
except OSError:
    reset = False
checkout, target = Path(sys.argv[1]), Path(sys.argv[2])
channel = os.fdopen(int(sys.argv[5]), "w")
cpu_before = cpu(resource.RUSAGE_SELF)
started = time.perf_counter()
timed("freeze (sync)", module.freeze)(None, None)
captured = timed("capture", module.capture)(
    checkout,
    target,
    user=None,
    timeout=float(sys.argv[3]),
    max_bytes=MAX_CHECKPOINT_BYTES,
    processors=TaskSettings().processors(),  # as the supervisor passes it, from its CPU
)
facts = {"size": captured.size, "sha256": captured.sha256, "md5": captured.md5}
print(json.dumps(facts), file=channel, flush=True)
begun = time.perf_counter()
grant = json.loads(sys.stdin.readline())
steps["presign (this benchmark)"] = time.perf_counter() - begun
headers = {k: v for k, v in grant["headers"].items() if k.lower() != "content-length"}
timed("upload", module.upload)(
    grant["url"], target, headers, size=captured.size, timeout=float(sys.argv[4])
)
checkpoint = time.perf_counter() - started
print(json.dumps({
    "checkpoint_s": checkpoint,
    "checkpoint_cpu_s": cpu(resource.RUSAGE_SELF) - cpu_before + cpu(resource.RUSAGE_CHILDREN),
    "steps_s": steps,
    "peak_rss_kb": status("VmHWM"),
    "resident_kb": resident,
    "hwm_reset": reset,
    "children_max_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), file=channel, flush=True)
"""

# The streaming baseline's uploader (see the module docstring): argv[1] the object's URL
# (scheme, host, port, /bucket/key), argv[2] the part size, argv[3] how many at once,
# argv[4] where its record goes (JSON). Exits 1 when a request fails.
UPLOADER = r"""
import base64, fcntl, hashlib, http.client, json, queue, ssl, sys, threading, time
from urllib.parse import urlsplit

started_at, started = time.time(), time.perf_counter()
target = urlsplit(sys.argv[1])
part_bytes, streams, record = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
context = ssl.create_default_context() if target.scheme == "https" else None
jobs = queue.Queue()
free = queue.Queue()  # the part buffers: those in flight and one being read
for _ in range(streams + 1):
    free.put(bytearray(part_bytes))
created = threading.Event()
failures, parts, marks = [], {}, {}
try:
    fcntl.fcntl(0, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MiB reads from tar, not 64 KiB
except OSError:
    pass

def since():
    return time.perf_counter() - started

def put(connection, suffix, body, headers):
    connection.request("PUT", target.path + suffix, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    if not 200 <= response.status < 300:
        raise RuntimeError(f"PUT {suffix}: HTTP {response.status}")

def worker():
    if context is None:
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
    else:
        connection = http.client.HTTPSConnection(
            target.hostname, target.port, timeout=60, context=context
        )
    try:
        connection.connect()  # the handshakes while tar starts
    except OSError:
        pass  # the first request tries again and reports it
    while (job := jobs.get()) is not None:
        try:
            job(connection)
        except Exception as failed:
            failures.append(repr(failed))
        finally:
            jobs.task_done()
    connection.close()

def create(connection):
    try:
        put(connection, ".create", b"", {"Content-Length": "0"})
        marks["create_s"] = since()
    finally:
        created.set()

def part(number, buffer, size):
    def job(connection):
        try:
            view = memoryview(buffer)[:size]
            digest = hashlib.sha256(view).digest()
            created.wait()
            if failures:
                return
            checksum = base64.b64encode(digest).decode()
            headers = {"Content-Length": str(size), "x-amz-checksum-sha256": checksum}
            put(connection, f".part-{number:05d}", view, headers)
            parts[number] = (size, digest.hex(), checksum)
        finally:
            free.put(buffer)
    return job

workers = [threading.Thread(target=worker, daemon=True) for _ in range(streams)]
for thread in workers:
    thread.start()
jobs.put(create)
source = sys.stdin.buffer.raw
number = total = 0
while not failures:
    buffer = free.get()
    view, size = memoryview(buffer), 0
    while size < part_bytes:
        count = source.readinto(view[size:])
        if not count:
            break
        size += count
    del view
    if size:
        number += 1
        total += size
        jobs.put(part(number, buffer, size))
    else:
        free.put(buffer)
    if size < part_bytes:
        break
marks["eof_s"] = since()
jobs.join()
marks["parts_s"] = since()
if not failures:
    listing = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ChecksumSHA256>{parts[n][2]}</ChecksumSHA256></Part>"
        for n in sorted(parts)
    )
    body = f"<CompleteMultipartUpload>{listing}</CompleteMultipartUpload>".encode()
    length = {"Content-Length": str(len(body))}
    jobs.put(lambda connection: put(connection, ".complete", body, length))
    jobs.join()
    marks["complete_s"] = since()
for _ in workers:
    jobs.put(None)
with open("/proc/self/status") as status:
    hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
with open(record, "w") as out:
    json.dump({
        "started_at": started_at,
        "bytes": total,
        "parts": [[n, parts[n][0], parts[n][1]] for n in sorted(parts)],
        "marks_s": marks,
        "peak_rss_kb": hwm,
        "failures": failures,
    }, out)
sys.exit(1 if failures or len(parts) != number else 0)
"""

# $1: the folder holding `checkout`, $2: the interpreter, $3: UPLOADER, then its arguments.
STREAM_PIPELINE = (
    'set -o pipefail; tar -I "zstd -3 -T0" -cf - -C "$1" checkout | "$2" -I -c "$3" "${@:4}"'
)
