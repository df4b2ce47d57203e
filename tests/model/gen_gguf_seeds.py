#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/fuzz_gguf.c: small GGUF files, valid and broken, each
under 64 KiB, covering every value type, nested arrays, v2/v3, alignments, the quant types, shard
keys, and the usual defects. Deterministic: rerun it and the files do not change.

    python3 tests/model/gen_gguf_seeds.py [outdir]   (default tests/fuzz/corpus/gguf)
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32: '<f',
          BOOL: '<B', U64: '<Q', I64: '<q', F64: '<d'}
# ggml type: (elements per block, bytes per block), llama.cpp b10573
TYPES = {'F32': (0, 1, 4), 'F16': (1, 1, 2), 'Q4_0': (2, 32, 18), 'Q8_0': (8, 32, 34),
         'Q4_K': (12, 256, 144), 'Q6_K': (14, 256, 210), 'IQ2_XXS': (16, 256, 66),
         'BF16': (30, 1, 2), 'MXFP4': (39, 32, 17), 'NVFP4': (40, 64, 36)}


def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack('<Q', len(b)) + b


def val(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack('<IQ', et, len(items)) + b''.join(val(et, i) for i in items)
    return struct.pack(SCALAR[t], v)


def kv(key, t, v):
    return s(key) + struct.pack('<I', t) + val(t, v)


def gguf(kvs, tensors, version=3, align=32, data_pad=True, magic=b'GGUF'):
    """tensors: (name, type name, ne list[, explicit relative offset])"""
    out = magic + struct.pack('<IQQ', version, len(tensors), len(kvs)) + b''.join(kvs)
    off, data_len = 0, 0
    infos = []
    for t in tensors:
        name, tn, ne = t[0], t[1], t[2]
        tid, bs, ts = TYPES[tn]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // bs * ts
        rel = t[3] if len(t) > 3 else off
        infos.append(s(name) + struct.pack('<I', len(ne)) +
                     b''.join(struct.pack('<q', d) for d in ne) + struct.pack('<IQ', tid, rel))
        data_len = max(data_len, rel + nbytes)
        off = (rel + nbytes + align - 1) // align * align
    out += b''.join(infos)
    out += b'\0' * ((-len(out)) % align)
    if data_pad:
        out += bytes((i * 7) & 0xff for i in range(data_len))
    return out


def arch_kvs(arch='llama', extra=()):
    return [kv('general.architecture', STR, arch),
            kv(arch + '.block_count', U32, 2),
            kv(arch + '.embedding_length', U32, 64),
            kv(arch + '.attention.head_count', U32, 4),
            kv(arch + '.attention.head_count_kv', U32, 2),
            kv(arch + '.feed_forward_length', U32, 96),
            kv(arch + '.expert_count', U32, 4),
            kv(arch + '.expert_used_count', U32, 2),
            kv(arch + '.context_length', U32, 256),
            kv(arch + '.rope.freq_base', F32, 10000.0),
            kv(arch + '.attention.layer_norm_rms_epsilon', F32, 1e-5),
            kv('tokenizer.ggml.tokens', ARR, (STR, ['<unk>', '<s>', '</s>', 'a', 'b'])),
            kv('tokenizer.ggml.scores', ARR, (F32, [0.0, -1.0, -2.0, -3.0, -4.0])),
            kv('tokenizer.ggml.token_type', ARR, (I32, [2, 3, 3, 1, 1]))] + list(extra)


MOE = [('token_embd.weight', 'F32', [64, 5]),
       ('blk.0.attn_norm.weight', 'F32', [64]),
       ('blk.0.attn_q.weight', 'Q8_0', [64, 16]),
       ('blk.0.ffn_gate_inp.weight', 'F32', [64, 4]),
       ('blk.0.ffn_gate_exps.weight', 'Q4_0', [64, 32, 2]),
       ('blk.0.ffn_down_exps.weight', 'Q4_0', [32, 64, 2]),
       ('output.weight', 'F16', [64, 5])]

ALL_TYPES = [kv('t.u8', U8, 200), kv('t.i8', I8, -5), kv('t.u16', U16, 60000),
             kv('t.i16', I16, -300), kv('t.u32', U32, 7), kv('t.i32', I32, -70000),
             kv('t.f32', F32, 0.5), kv('t.bool', BOOL, 1), kv('t.str', STR, 'hello'),
             kv('t.u64', U64, 1 << 40), kv('t.i64', I64, -(1 << 40)), kv('t.f64', F64, 1e-300),
             kv('t.nested', ARR, (ARR, [(I32, [1, 2]), (STR, ['x', 'yz']), (ARR, [(U8, [1])])])),
             kv('t.empty', ARR, (F32, [])), kv('t.nul', STR, b'a\0b')]


def deep(n):
    v = (U8, [42])
    for _ in range(n - 1):
        v = (ARR, [v])
    return v


def seeds():
    yield 'moe_v3', gguf(arch_kvs(), MOE)
    yield 'moe_v2', gguf(arch_kvs(), MOE, version=2)
    yield 'all_value_types', gguf(arch_kvs(extra=ALL_TYPES), MOE[:2])
    yield 'align_64', gguf(arch_kvs(extra=[kv('general.alignment', U32, 64)]), MOE, align=64)
    yield 'align_1', gguf([kv('general.alignment', U32, 1)], MOE[:3], align=1)
    yield 'quant_types', gguf(arch_kvs('qwen3moe', [kv('qwen3moe.expert_feed_forward_length', U32, 256),
                                                   kv('qwen3moe.attention.key_length', U32, 32)]),
                              [('a', 'Q4_K', [256, 2]), ('b', 'Q6_K', [256, 1]),
                               ('c', 'IQ2_XXS', [256, 1]), ('d', 'MXFP4', [64, 2]),
                               ('e', 'NVFP4', [64, 1]), ('f', 'BF16', [3, 5])])
    heads = kv('llama.attention.head_count', U32, 4)
    per_layer = [x if x != heads else kv('llama.attention.head_count', ARR, (U32, [4, 8, 2]))
                 for x in arch_kvs()]
    yield 'per_layer_heads', gguf(per_layer, MOE[:1])
    yield 'nested_depth_8', gguf([kv('deep', ARR, deep(8))], [])
    yield 'no_tensors', gguf([kv('general.name', STR, 'empty')], [])
    yield 'empty_header', gguf([], [])
    yield 'shard_1_of_2', gguf(arch_kvs(extra=[kv('split.no', U16, 0), kv('split.count', U16, 2),
                                               kv('split.tensors.count', I32, 4)]), MOE[:2])
    yield 'scalar_and_empty_tensor', gguf([], [('s', 'F32', []), ('z', 'F32', [0, 3])])
    yield 'bad_overlap', gguf([], [('a', 'F32', [16], 0), ('b', 'F32', [16], 32)])
    yield 'bad_misaligned', gguf([], [('a', 'F32', [16], 16)])
    yield 'bad_duplicate', gguf([], [('a', 'F32', [8]), ('a', 'F32', [8])])
    yield 'bad_alignment_3', gguf([kv('general.alignment', U32, 3)], [])
    yield 'bad_version_1', gguf([], [], version=1)
    yield 'bad_big_endian', gguf([], [], version=0x03000000)
    yield 'bad_truncated', gguf(arch_kvs(), MOE)[:700]
    yield 'bad_past_eof', gguf([], MOE[:3], data_pad=False) + b'\1' * 40
    yield 'bad_key_type', b'GGUF' + struct.pack('<IQQ', 3, 0, 1) + s('k') + struct.pack('<II', 13, 0)
    yield 'bad_count', b'GGUF' + struct.pack('<IQQ', 3, 1 << 40, 1 << 40)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..', 'fuzz', 'corpus', 'gguf')
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        assert len(data) < 64 * 1024, (name, len(data))
        with open(os.path.join(out, name + '.gguf'), 'wb') as f:
            f.write(data)
        print('%-28s %6d bytes' % (name, len(data)))


if __name__ == '__main__':
    main()
