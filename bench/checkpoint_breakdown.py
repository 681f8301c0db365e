"""What the last checkpoint of a libssa snapshot file wrote, by section kind.

  python3 bench/checkpoint_breakdown.py FILE.ssa [--rows-per-token-bytes B --new-tokens N]

Reads the two superblocks (docs/SNAPSHOT_FORMAT.md): the sections of the live
generation that lie after the previous generation's committed length are the
checkpoint's; the rest of the growth is its table and alignment padding (a hole
for padding of 512 bytes or more, which is not written). Prints bytes per kind.
"""
import argparse
import collections
import struct

KINDS = {1: "config", 2: "layers", 3: "kv-pages", 4: "code-pages", 5: "codebooks", 6: "metadata", 7: "shard",
         8: "kv-rows", 9: "code-rows"}


def superblock(b, off):
    gen, table_off, table_len, _, file_len = struct.unpack_from("<QQQQQ", b, off + 24)
    return gen, table_off, table_len, file_len


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--token-bytes", type=int, default=0, help="K/V + codes of one token over all layers")
    ap.add_argument("--new-tokens", type=int, default=0)
    a = ap.parse_args()
    b = open(a.file, "rb").read()
    slots = sorted((superblock(b, o) for o in (0, 2048) if b[o:o + 4] == b"\x89SSA"), reverse=True)
    gen, table_off, table_len, file_len = slots[0]
    prev_len = slots[1][3] if len(slots) > 1 and slots[1][0] == gen - 1 else 4096
    n = struct.unpack_from("<I", b, table_off + 8)[0]
    per_kind = collections.Counter()
    for i in range(n):
        kind, layer, off, length = struct.unpack_from("<IIQQ", b, table_off + 64 + 64 * i)
        if off >= prev_len:
            per_kind[KINDS.get(kind, str(kind))] += length
    grown = file_len - prev_len
    sections = sum(per_kind.values())
    print("generation %d: the file grew %d B (from %d to %d)" % (gen, grown, prev_len, file_len))
    for k, v in sorted(per_kind.items()):
        print("  %-10s %10d B" % (k, v))
    print("  %-10s %10d B (%d sections listed)" % ("table", table_len, n))
    print("  %-10s %10d B (alignment; this writer leaves pads of 512 B or more as holes)" % ("padding", grown - sections - table_len))
    if a.token_bytes and a.new_tokens:
        new = a.token_bytes * a.new_tokens
        print("  new K/V + codes: %d B; sections / new = %.3f; growth / new = %.3f" % (new, sections / new, grown / new))


if __name__ == "__main__":
    main()
