"""How much detail a source's images hold: the median shorter side of a
sample of its training images, read from their headers where the format
allows (a JPEG's or PNG's first bytes), so a gs:// folder or a large set
of records costs seconds, not a pass over the data.

A run whose image_size is left open trains at the network's own size
capped by it (models.image_sizes): 8 px digits at 32, a folder of 120 px
photographs at 128, ImageNet at the network's own.
"""

import dataclasses
import io
import statistics

# Images read for the median: enough that one odd image does not move it,
# few enough that a bucket answers in seconds.
SAMPLE = 64
# A header that does not end in this many bytes (a large EXIF block before
# a JPEG's frame header) is read whole.
HEADER_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Detail:
  """The median shorter side of a source's images (0: unknown without
  preparing or reading the data), and how it was found."""
  side: int = 0
  found: str = ''

  def describe(self):
    """'median shorter side 120 px of 64 training images', '8x8 images
    (cifar10's metadata)', or why it is unknown."""
    return self.found


UNKNOWN = Detail(0, 'its images are not read before it is prepared')


def fixed(height, width, where):
  """The Detail of a source whose images all have one shape."""
  return Detail(min(height, width), f'{height}x{width} images ({where})')


def of_encoded(images, what):
  """The Detail of `images`, an iterable of encoded images (bytes, or
  callables that return their first and then all bytes: (head, whole));
  those no header parser reads are passed over. `what` says where they
  came from, for the plan's line."""
  sides = [side for side in map(_shorter_side, images) if side]
  if not sides:
    return Detail(0, f'no header of {what} could be read')
  side = int(statistics.median(sides))
  return Detail(side, f'median shorter side {side} px of {len(sides)} {what}')


def of_files(paths, read_head, what):
  """The Detail of up to SAMPLE of `paths`, spread over the listing;
  `read_head(path, size)` reads a file's first `size` bytes (None: all)."""
  paths = list(paths)
  chosen = paths[::max(1, len(paths) // SAMPLE)][:SAMPLE]
  return of_encoded(((lambda p=path: read_head(p, HEADER_BYTES),
                      lambda p=path: read_head(p, None))
                     for path in chosen), what)


def _shorter_side(image):
  """The shorter side of one encoded image from its header, or 0."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  readers = image if isinstance(image, tuple) else (lambda: image,)
  for read in readers:
    try:
      with Image.open(io.BytesIO(read())) as opened:
        width, height = opened.size
      return min(width, height)
    except Exception:  # pylint: disable=broad-except
      continue  # Truncated before its size, or no image: the whole file next.
  return 0
