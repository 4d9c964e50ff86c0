"""Whether a model has learned anything: a run whose evaluation predicts
one class for nearly every example, or scores within chance's noise, and
predictions whose probabilities do not vary across images, say so in one
line with what to try, rather than report a figure that looks like a
result.
"""

import numpy as np

# One class predicted for at least this share of the examples (while it is
# far from that share of the truth) is a model that ignores its input.
ONE_CLASS_SHARE = 0.9
# Probabilities that differ by less than this across images do not depend
# on the image.
FLAT = 1e-3


def not_learned(confusion, class_names, train_steps, train_examples,
                steps_per_epoch):
  """One line where the evaluation's `confusion` matrix (rows: true class,
  columns: predicted) shows a model that has not learned, naming what was
  seen and what to try; '' where it has. `class_names`: index -> name
  (() for indices); the rest describes the run that trained it."""
  confusion = np.asarray(confusion, np.float64)
  examples = confusion.sum()
  truth, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
  if (truth > 0).sum() < 2:
    return ''  # Held-out examples of one class: one answer is right.
  accuracy = np.trace(confusion) / examples
  # Chance: always answering the commonest class, and its noise (two
  # standard deviations of an accuracy over this many examples).
  chance = truth.max() / examples
  noise = 2 * (chance * (1 - chance) / examples) ** 0.5
  top = int(predicted.argmax())
  name = class_names[top] if len(class_names) > top else str(top)
  seen = []
  if (predicted[top] >= ONE_CLASS_SHARE * examples and
      truth[top] < ONE_CLASS_SHARE * examples):
    seen.append(f'evaluation predicted {name!r} for {predicted[top]:.0f} of '
                f'{examples:.0f} examples')
  if accuracy <= chance + noise:
    seen.append(f'accuracy {accuracy:.4f} is within chance\'s noise '
                f'({chance:.2f} +/- {noise:.2f} over {examples:.0f} '
                'examples)')
  if not seen:
    return ''
  return (f'the model has not learned yet: {"; ".join(seen)}, after '
          f'{_count(train_steps, "step")} over {train_examples} training '
          f'examples ({_count(steps_per_epoch, "step")} an epoch); try more '
          'steps '
          '(--config.epochs, or a smaller --config.global_batch_size), a '
          'pretrained start (--config.init_from=imagenet), or another '
          '--config.base_learning_rate')


def _count(number, noun):
  return f'{number} {noun}{"" if number == 1 else "s"}'


def flat_probabilities(probabilities, names):
  """One line where the class probabilities of several images (rows) do not
  vary from image to image: the model's output ignores its input; ''
  otherwise or for one image. `names`: the images, as given."""
  probabilities = np.asarray(probabilities, np.float64)
  if len(probabilities) < 2:
    return ''
  spread = float((probabilities.max(axis=0) - probabilities.min(axis=0)).max())
  if spread >= FLAT:
    return ''
  return (f'the {len(names)} images got the same probabilities (to '
          f'{spread:.1g}): the model\'s output does not depend on the image, '
          'so it has not learned; train it longer, or from a pretrained '
          'start (--config.init_from=imagenet)')
