"""What a user sends as an image, turned into a decoded RGB PIL image; each failure an `ImageInputError` naming it.

Sources: `data:` URIs (base64 PNG, JPEG, WebP or GIF, its first frame), `file://` URLs under the allowed local
media root, and offline a PIL image, the encoded bytes or a local path. http(s) URLs are refused: this server never
fetches anything. Pillow decodes, restricted to the four formats; the encoded size is checked before decoding and
the pixel count from the header before the pixels are decoded (a small file can declare a huge image). Images
with transparency are composited onto white, as the HF processors' RGB conversion does.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image, UnidentifiedImageError

# Pillow's format names -> the data: URI types that may carry them
SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MIME_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP",
                "image/gif": "GIF"}  # fmt: skip
FORMATS_TEXT = "PNG, JPEG, WebP or GIF"
DATA_URI_EXAMPLE = "data:image/png;base64,..."


class ImageInputError(ValueError):
    """An image that cannot be served: the message says what is wrong with it (the server answers 400)."""


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 2**20  # the encoded image
    max_pixels: int = 4096 * 4096  # width x height, checked from the header before decoding
    local_media_root: str | None = None  # file:// URLs must resolve inside this directory (None: refused)

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1:
            raise ValueError(f"image limits must be >= 1, got {self.max_bytes} bytes, {self.max_pixels} pixels")
        if self.local_media_root is not None:
            root = Path(self.local_media_root)
            if not root.is_dir():
                raise ValueError(f"allowed_local_media_path {self.local_media_root} is not a directory")
            object.__setattr__(self, "local_media_root", str(root.resolve()))


def load_image(source, limits: ImageLimits, *, bare_paths: bool = False) -> Image.Image:
    """The image `source` holds: a PIL image, encoded bytes, a data: / file:// URL (str), or with `bare_paths`
    (the offline API's own inputs) a local path (str or os.PathLike) read without the local-media root."""
    if isinstance(source, Image.Image):
        _check_pixels(source.size, limits)
        return _decoded_rgb(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode_image_bytes(bytes(source), limits)
    if isinstance(source, os.PathLike) and bare_paths:
        return decode_image_bytes(_read_file(Path(source), limits), limits)
    if isinstance(source, str):
        return load_image_url(source, limits, bare_paths=bare_paths)
    accepted = "a PIL image, bytes, a data: URI or a path" if bare_paths else "a data: URI"
    raise TypeError(f"an image must be {accepted}, got {type(source).__name__}")


def load_image_url(url: str, limits: ImageLimits, *, bare_paths: bool = False) -> Image.Image:
    scheme = url[: url.find(":")].lower() if ":" in url[:16] else ""
    if scheme == "data":
        return decode_image_bytes(decode_data_uri(url, limits), limits)
    if scheme in ("http", "https"):
        raise ImageInputError(f"this server does not fetch URLs: send the image as a data: URI ({DATA_URI_EXAMPLE})")
    if scheme == "file":
        path = _file_url_path(url)
        return decode_image_bytes(_read_file(path, limits, limits.local_media_root, rooted=True), limits)
    if bare_paths:  # the offline API's own input: a local path
        return decode_image_bytes(_read_file(Path(url), limits), limits)
    shown = f"scheme {scheme!r}" if scheme else f"{url[:32]!r}"
    raise ImageInputError(f"an image URL must be a data: URI ({DATA_URI_EXAMPLE}) or a file:// URL, got {shown}")


def decode_data_uri(uri: str, limits: ImageLimits) -> bytes:
    """The bytes of a base64 `data:<image type>;base64,<data>` URI whose type is one of the supported formats."""
    header, comma, payload = uri.partition(",")
    if not comma:
        raise ImageInputError(f"the data: URI has no ',' before its data ({DATA_URI_EXAMPLE})")
    mime, *params = [p.strip().lower() for p in header[len("data:"):].split(";")]
    if not mime:
        raise ImageInputError(f"the data: URI names no image type ({DATA_URI_EXAMPLE})")
    if mime not in MIME_FORMATS:
        raise ImageInputError(f"image type {mime!r} is not supported: send {FORMATS_TEXT}")
    if "base64" not in params:
        raise ImageInputError(f"the data: URI must be base64-encoded ({DATA_URI_EXAMPLE})")
    if len(payload) > 4 * (limits.max_bytes // 3 + 1) + 4096:  # decoding could not be under the limit
        raise ImageInputError(_too_large(len(payload) * 3 // 4, limits))
    payload = "".join(payload.split())  # line-wrapped base64 (the `base64` tool's) is still base64
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("the data: URI's base64 data is corrupt") from None
    if len(data) > limits.max_bytes:
        raise ImageInputError(_too_large(len(data), limits))
    return data


def decode_image_bytes(data: bytes, limits: ImageLimits) -> Image.Image:
    """An encoded PNG / JPEG / WebP / GIF (its first frame), decoded and converted to RGB."""
    if not data:
        raise ImageInputError("the image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageInputError(_too_large(len(data), limits))
    try:
        image = Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS)
    except UnidentifiedImageError:
        found = _format_of(data)
        if found is not None:
            raise ImageInputError(f"{found} images are not supported: send {FORMATS_TEXT}") from None
        raise ImageInputError(f"the data is not an image Pillow can decode ({FORMATS_TEXT})") from None
    except Image.DecompressionBombError as e:
        raise ImageInputError(f"the image is too large to decode: {e}") from None
    _check_pixels(image.size, limits)
    return _decoded_rgb(image)


def _decoded_rgb(image: Image.Image) -> Image.Image:
    """The first frame's pixels in RGB; alpha composited onto white (the HF processors' convert_to_rgb)."""
    try:
        image.seek(0)
        image.load()
        if image.mode == "RGB":
            return image
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    except Exception as e:  # a truncated or corrupt stream; Pillow raises OSError, ValueError, SyntaxError, ...
        raise ImageInputError(f"the image data is corrupt or truncated ({type(e).__name__}: {e})") from None


def _check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise ImageInputError(f"the image has no pixels ({width} x {height})")
    if width * height > limits.max_pixels:
        raise ImageInputError(f"the image has {width} x {height} = {width * height} pixels; this server takes at "
                              f"most {limits.max_pixels} (max_image_pixels)")  # fmt: skip


def _too_large(size: int, limits: ImageLimits) -> str:
    return f"the image has {size} bytes; this server takes at most {limits.max_bytes} (max_image_bytes)"


def _format_of(data: bytes) -> str | None:
    """The format Pillow finds in `data` among all it knows (for the error message only; nothing is decoded)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.format
    except Exception:
        return None


def _file_url_path(url: str) -> Path:
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ImageInputError(f"file:// URLs name local files only, got host {parsed.netloc!r}")
    path = Path(unquote(parsed.path))
    if not path.is_absolute():
        raise ImageInputError("a file:// URL needs an absolute path (file:///dir/image.png)")
    return path


def _read_file(path: Path, limits: ImageLimits, root: str | None = None, *, rooted: bool = False) -> bytes:
    """The file's bytes, at most max_bytes of them. `rooted` (file:// URLs): the path, its symlinks and '..'
    resolved, must lie inside `root`; the offline API's own paths are read as given."""
    if rooted:
        if root is None:
            raise ImageInputError("this server reads no local files: start it with --allowed_local_media_path DIR "
                                  f"to allow file:// URLs under DIR, or send a data: URI ({DATA_URI_EXAMPLE})")
        path = Path(os.path.realpath(path))
        if not path.is_relative_to(root):
            raise ImageInputError(f"{path} is outside the allowed local media path (allowed_local_media_path)")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limits.max_bytes:
                raise ImageInputError(_too_large(size, limits))
            return f.read(limits.max_bytes + 1)
    except FileNotFoundError:
        raise ImageInputError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ImageInputError(f"{path} is a directory, not an image") from None
    except OSError as e:
        raise ImageInputError(f"{path} cannot be read: {e.strerror or e}") from None
