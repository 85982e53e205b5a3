"""Decimated visual meshes for the simulated Panda: the CAD meshes drawn with fewer faces.

The asset meshes are full CAD resolution; offscreen rendering of them dominates a control tick on
small machines. :func:`use_decimated_visuals` adds decimated copies for drawing (cached under
``~/.cache/sequence-ai/panda_meshes``) and keeps the originals as hidden collision geometry.
Needs ``fast-simplification`` and pillow (the ``sim`` extra); without them the full meshes are drawn.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # as panda_sim: before mujoco is imported

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["VISUAL_MESH_FACES", "VISUAL_GROUP", "COLLISION_GROUP", "use_decimated_visuals"]

# Visual meshes: the asset meshes are full CAD resolution (134k faces in all), which makes
# offscreen rendering (software GL on small machines) the dominant cost of a control tick. The
# robot is drawn with decimated copies (about this many faces per link; smaller meshes are left
# as they are) while the original meshes stay in the model, hidden in geom group 3, as the
# collision geometry, so contacts are unchanged. None = draw the full-resolution meshes.
VISUAL_MESH_FACES = 4000
VISUAL_GROUP = 2
COLLISION_GROUP = 3
_DECIMATION_VERSION = "4"  # bump when the decimation recipe changes (cache key)


def _mesh_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sequence-ai" / "panda_meshes"


def _parse_obj(path: Path):
    """Triangles of a Wavefront OBJ: vertices (V, 3), texcoords (T, 2) in OBJ convention,
    face vertex indices (F, 3) and face texcoord indices (F, 3) (-1 where absent), 0-based."""
    v, vt, fv, ft = [], [], [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("v "):
                v.append(line.split()[1:4])
            elif line.startswith("vt "):
                vt.append(line.split()[1:3])
            elif line.startswith("f "):
                corners = [c.split("/") for c in line.split()[1:]]
                idx = [int(c[0]) for c in corners]
                tix = [int(c[1]) if len(c) > 1 and c[1] else 0 for c in corners]
                for k in range(1, len(idx) - 1):  # fan-triangulate polygons
                    fv.append((idx[0], idx[k], idx[k + 1]))
                    ft.append((tix[0], tix[k], tix[k + 1]))
    verts = np.asarray(v, float).reshape(-1, 3)
    tcs = np.asarray(vt, float).reshape(-1, 2)
    fv_a = np.asarray(fv, np.int64).reshape(-1, 3)
    ft_a = np.asarray(ft, np.int64).reshape(-1, 3)
    fv_a = np.where(fv_a < 0, fv_a + len(verts), fv_a - 1)  # OBJ: 1-based, negatives relative
    ft_a = np.where(ft_a < 0, ft_a + len(tcs), ft_a - 1)
    return verts, tcs, fv_a, ft_a


def _decimate_mesh(obj_path: Path, texture: np.ndarray | None, target_faces: int):
    """Decimated copy of an OBJ mesh in MuJoCo conventions: (vert (N, 3), face (M, 3),
    texcoord (N, 2) or None, source face count).

    Duplicate vertex positions are merged first. Textured meshes (``texture``: (H, W, 3)
    uint8 palette image, as the Panda's) are split by the palette colour each face samples;
    each colour part is decimated on its own, with a share of ``target_faces`` proportional to
    its size but at least ``min(its size, 400)`` faces (so small coloured details keep their
    shape), and every vertex of a part gets the texcoord of that colour's texel. Without a
    texture the mesh is decimated as one part.
    """
    import fast_simplification  # optional dependency: the "sim" extra

    verts, tcs, fv, ft = _parse_obj(obj_path)
    _, first, remap = np.unique(np.round(verts, 7), axis=0, return_index=True,
                                return_inverse=True)
    verts = verts[first]
    faces_all = remap.reshape(-1)[fv]
    if texture is not None and len(tcs) and np.all(ft >= 0):
        h, w = texture.shape[:2]
        uv = tcs[ft].mean(axis=1)  # the palette cell each face samples
        col = np.clip((uv[:, 0] * w).astype(int), 0, w - 1)
        row = np.clip(((1.0 - uv[:, 1]) * h).astype(int), 0, h - 1)  # OBJ v points up
        _, part = np.unique(texture[row, col].reshape(len(fv), -1), axis=0,
                            return_inverse=True)
        part = part.reshape(-1)
    else:
        texture = None
        part = np.zeros(len(fv), int)
    out_v, out_f, out_t = [], [], []
    n_v = 0
    for k in np.unique(part):
        sel = np.flatnonzero(part == k)
        f = faces_all[sel]
        f = f[(f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 2] != f[:, 0])]
        used, f = np.unique(f, return_inverse=True)
        pts = verts[used]
        f = f.reshape(-1, 3)
        want = max(int(round(target_faces * len(sel) / len(fv))), min(len(f), 400))
        if want < len(f):
            pts, f = fast_simplification.simplify(pts, f, target_count=want)
        out_v.append(np.asarray(pts, float))
        out_f.append(np.asarray(f, np.int64) + n_v)
        if texture is not None:
            r, c = row[sel[0]], col[sel[0]]
            tc = ((c + 0.5) / texture.shape[1], (r + 0.5) / texture.shape[0])  # MuJoCo: v down
            out_t.append(np.tile(tc, (len(pts), 1)))
        n_v += len(pts)
    return (np.concatenate(out_v), np.concatenate(out_f),
            np.concatenate(out_t) if out_t else None, len(fv))


def _visual_mesh(obj_path: Path, texture_path: Path | None, target_faces: int):
    """``_decimate_mesh`` (plus the source face count) through a cache under ``~/.cache/sequence-ai/panda_meshes`` keyed by
    the SHA-256 of the OBJ file, the texture file and the recipe (target, version)."""
    h = hashlib.sha256(f"{_DECIMATION_VERSION}:{target_faces}:".encode())
    h.update(obj_path.read_bytes())
    if texture_path is not None:
        h.update(texture_path.read_bytes())
    cache = _mesh_cache_dir() / f"{obj_path.stem}-{h.hexdigest()[:24]}.npz"
    try:
        with np.load(cache) as z:
            return (z["vert"], z["face"], z["texcoord"] if "texcoord" in z.files else None,
                    int(z["source_faces"]))
    except (OSError, ValueError, KeyError):
        pass
    texture = None
    if texture_path is not None:
        from PIL import Image  # the "sim" extra brings pillow
        with Image.open(texture_path) as im:
            texture = np.asarray(im.convert("RGB"))
    vert, face, tc, n_src = _decimate_mesh(obj_path, texture, target_faces)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npz")
        arrays = {"vert": vert, "face": face, "source_faces": np.array(n_src)}
        if tc is not None:
            arrays["texcoord"] = tc
        np.savez(tmp, **arrays)
        os.replace(tmp, cache)
    except OSError:
        pass  # read-only home: decimate again next time
    return vert, face, tc, n_src


def use_decimated_visuals(s: mujoco.MjSpec, adir: Path, target_faces: int) -> None:
    """Draw every mesh geom of ``s`` with at least ``2 * target_faces`` faces (the arm links;
    not the hand, whose thin grey inset opens gaps when decimated) with a decimated copy; the
    original geom keeps its collision role, hidden in ``COLLISION_GROUP``."""
    mat_tex = {m.name: m.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] for m in s.materials}
    tex_file = {t.name: adir / Path(t.file).name for t in s.textures if t.file}
    meshes = {m.name: m for m in s.meshes}
    made: dict = {}
    for g in list(s.geoms):
        if g.type != mujoco.mjtGeom.mjGEOM_MESH or g.meshname not in meshes:
            continue
        src = meshes[g.meshname]
        obj = Path(src.file)
        if obj.suffix.lower() != ".obj":
            continue
        tex = tex_file.get(mat_tex.get(g.material, ""))
        key = (g.meshname, tex)
        if key not in made:
            try:
                vert, face, tc, n_src = _visual_mesh(obj, tex, target_faces)
            except ImportError:  # fast-simplification missing (pip install sequence-ai[sim])
                warnings.warn("fast-simplification is not installed: drawing the full-"
                              "resolution Panda meshes (slow offscreen rendering)")
                return
            if n_src < 2 * target_faces:
                made[key] = None  # small enough (the hand, the fingers): draw the original
            else:
                name = f"{g.meshname}_visual" + ("" if tex is None else f"_{Path(tex).stem}")
                m = s.add_mesh(name=name)
                m.scale = src.scale
                m.uservert = vert.astype(np.float32).reshape(-1).tolist()
                m.userface = face.astype(np.int32).reshape(-1).tolist()
                if tc is not None:
                    m.usertexcoord = tc.astype(np.float32).reshape(-1).tolist()
                    m.userfacetexcoord = m.userface
                made[key] = name
        if made[key] is None:
            continue
        body = g.parent
        body.add_geom(name=(f"{g.name}_visual" if g.name else ""), type=mujoco.mjtGeom.mjGEOM_MESH,
                      meshname=made[key], material=g.material, rgba=list(g.rgba), pos=list(g.pos),
                      quat=list(g.quat), contype=0, conaffinity=0, group=VISUAL_GROUP,
                      density=0.0, mass=0.0)
        g.group = COLLISION_GROUP
