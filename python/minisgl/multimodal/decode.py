"""Encoded image bytes -> an RGB ``PIL.Image``: PNG, JPEG, WebP, or a GIF's first frame.

The size is checked from the header, before any pixel is decoded (a small file can expand to
gigabytes); a corrupt or truncated file fails while its pixels load. Transparency is composited
onto white, as transformers' ``convert_to_rgb`` does, so the image the preprocessor sees is the
one transformers would see.
"""

from __future__ import annotations

import io
import warnings

from .items import MediaError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


def decode_image(data: bytes, field: str, max_pixels: int):
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(field, f"the image has more than the {max_pixels} pixels "
                         "allowed") from None
    except UnidentifiedImageError:
        raise MediaError(field, "not a readable image (PNG, JPEG, WebP or GIF)") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise MediaError(field, f"the image is corrupt: {e}") from None
    if image.format not in FORMATS:
        raise MediaError(field, f"{image.format} images are not supported (PNG, JPEG, WebP, "
                         "GIF)")
    width, height = image.size
    if width < 1 or height < 1:
        raise MediaError(field, "the image is empty")
    if width * height > max_pixels:
        raise MediaError(field, f"the image is {width} x {height} pixels, more than the "
                         f"{max_pixels} allowed")
    try:
        image.seek(0)  # a GIF's first frame
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise MediaError(field, f"the image is corrupt or truncated: {e}") from None
    return to_rgb(image)


def to_rgb(image):
    """RGB; an image with transparency is laid over white first."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")
