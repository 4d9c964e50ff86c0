"""A folder of real photographs in class folders, as a user brings one.

Crops of the colour photographs scikit-image and scikit-learn ship (an
astronaut, a cat, a cup of coffee, a rocket, a Chinese temple, a flower),
one class each: a window of 30-100% of the photograph's shorter side, of
aspect 3:4 to 4:3, at a random place, resized so its shorter side is 80 to
320 px and stored as a JPEG of quality 80-95, a fifth of them mirrored.
The class is the photograph a crop comes from. A stray notes.txt sits
among the images, as in a folder a person keeps.

  python tests/photo_folder.py /tmp/photos --per_class=60
"""

import argparse
import os

import numpy as np
from PIL import Image

CLASSES = ('astronaut', 'chelsea', 'coffee', 'rocket', 'china', 'flower')
SIDES = (80, 320)  # The crops' shorter side, px.


def photographs():
  """{class name: uint8 [H, W, 3]} of the photographs the crops come from."""
  import skimage.data  # pylint: disable=g-import-not-at-top
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  china, flower = datasets.load_sample_images().images
  return {'astronaut': skimage.data.astronaut(),
          'chelsea': skimage.data.chelsea(), 'coffee': skimage.data.coffee(),
          'rocket': skimage.data.rocket(), 'china': china, 'flower': flower}


def write(root, per_class, seed=0, classes=CLASSES, sides=SIDES):
  """Writes `per_class` crops of each of `classes` (their shorter side
  within `sides`, px) under root/<class>/ and a stray
  root/<first class>/notes.txt; returns the images' paths."""
  rng = np.random.default_rng(seed)
  photos = photographs()
  paths = []
  for name in classes:
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    photo = Image.fromarray(photos[name])
    for index in range(per_class):
      path = os.path.join(folder, f'{name}_{index:04d}.jpg')
      _crop(photo, rng, sides).save(path, quality=int(rng.integers(80, 96)))
      paths.append(path)
  with open(os.path.join(root, classes[0], 'notes.txt'), 'w') as f:
    f.write('taken on a Sunday; the blurry ones are still to sort\n')
  return paths


def _crop(photo, rng, sides):
  width, height = photo.size
  short = min(width, height)
  side = rng.uniform(0.3, 1.0) * short
  aspect = rng.uniform(3 / 4, 4 / 3)
  crop_w = int(min(width, side * aspect ** 0.5))
  crop_h = int(min(height, side / aspect ** 0.5))
  left = int(rng.integers(0, width - crop_w + 1))
  top = int(rng.integers(0, height - crop_h + 1))
  image = photo.crop((left, top, left + crop_w, top + crop_h))
  target = rng.uniform(*sides) / min(crop_w, crop_h)
  image = image.resize((max(1, round(crop_w * target)),
                        max(1, round(crop_h * target))), Image.BICUBIC)
  return image.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.2 else image


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('root')
  parser.add_argument('--per_class', type=int, default=60)
  parser.add_argument('--seed', type=int, default=0)
  arguments = parser.parse_args()
  written = write(arguments.root, arguments.per_class, arguments.seed)
  print(f'wrote {len(written)} photographs in {len(CLASSES)} class folders '
        f'under {arguments.root}')
