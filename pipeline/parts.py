"""Named parts: every data source, augmentation, model family, optimizer and
learning-rate schedule is one object, registered in its kind's Table.

A part carries its name (what a config names it by: config.dataset,
config.augment, config.model, config.optimizer, config.lr_schedule,
config.batch_norm, config.squeeze_excite, config.depthwise), a one-line
description, its own config keys with one-line descriptions, and its
checks. The rest of a run asks the part itself (a source for the files
its workers read, a model family for its published weights), never
compares its name. Every key's default is in configs/default.py, the one
home of defaults, which imports nothing of the pipeline (a test holds
each part's keys to it); validation checks a config against the tables,
every error lists the names they hold, and docs/configs-and-data.md's
tables of names
are tested against them: a description cannot drift. As timm's model
registry and big_vision's registry find a model or an optimizer by name.
"""

import collections.abc
import dataclasses
import difflib
import re

from pipeline.errors import UserError


@dataclasses.dataclass(frozen=True)
class Key:
  """One config key a part reads, by what it means (its default is
  configs/default.py's)."""
  doc: str


class Settings(collections.abc.Mapping):
  """One part's own keys and their values in a config, read by attribute
  (`settings.train_files`) or by key; a key the part did not declare is an
  AttributeError or KeyError here, where a config would silently give the
  run's value."""

  def __init__(self, values):
    self._values = dict(values)

  def __getitem__(self, key):
    return self._values[key]

  def __getattr__(self, key):
    try:
      return self.__dict__['_values'][key]
    except KeyError:
      raise AttributeError(f'{key!r} is not a key of this part') from None

  def __iter__(self):
    return iter(self._values)

  def __len__(self):
    return len(self._values)


class Part:
  """A named part; each kind subclasses it with what the run asks of it."""
  name: str
  description: str  # One line: the docs' tables and the config's notes.
  keys = {}  # {config key: Key} that this part alone reads.

  def names(self):
    """Every name the config may give this part (a model family has one
    per size)."""
    return (self.name,)

  def check(self, settings):
    """A one-line UserError for a value of this part's keys (its Settings)
    that cannot run; None otherwise."""
    del settings


class Table:
  """The parts of one kind, by name, in the order registered. `key`: the
  config key that names one; `fallback`: the part for any other name
  (tensorflow-datasets' sets), or None."""

  def __init__(self, kind, key, accepted='', left_open=None):
    self.kind, self.key = kind, key
    self.accepted = accepted  # Words for names no table lists, if any.
    # (value, words): the config's value that leaves the choice to the
    # run (the plan resolves it), and what the run then takes; None: a
    # part must be named.
    self.left_open = left_open
    self.fallback = None
    self._parts = {}

  def register(self, part, fallback=False):
    """Adds `part` under each of its names; returns it."""
    for name in part.names():
      if name in self._parts:
        raise ValueError(f'{self.kind} {name!r} registered twice')
      self._parts[name] = part
    if fallback:
      self.fallback = part
    return part

  def names(self):
    return tuple(self._parts)

  def __iter__(self):
    return iter(self._parts)

  def __contains__(self, name):
    return name in self._parts

  def parts(self):
    """Each part once, in the order registered (the fallback last)."""
    return tuple(dict.fromkeys([*self._parts.values(),
                                *filter(None, [self.fallback])]))

  def __getitem__(self, name):
    part = self._parts.get(name, self.fallback)
    if part is None:
      near = self.nearest(name)
      raise UserError(f'unknown {self.key} {name!r}'
                      + (f' (did you mean {near!r}?)' if near else '')
                      + f'; accepted: {self.listed()}')
    return part

  def nearest(self, name):
    """The registered name `name` most likely meant ('efficientnet-b0',
    'EfficientNetB0': efficientnet_b0), or None."""
    squeezed = lambda text: re.sub(r'[^a-z0-9]', '', str(text).lower())
    by_letters = {squeezed(known): known for known in self._parts}
    if squeezed(name) in by_letters:
      return by_letters[squeezed(name)]
    digits = lambda text: re.sub(r'\D', '', str(text))
    # A near spelling, not another size of the same name (b9 is no b7).
    close = [known for known in difflib.get_close_matches(
        str(name), list(self._parts), n=3) if digits(known) == digits(name)]
    return close[0] if close else None

  def of(self, config):
    """The part `config` (a ConfigDict, or any object of its fields) names."""
    return self[getattr(config, self.key)]

  def settings(self, config):
    """The Settings of the part `config` names: its own keys' values, and
    this table's key (the name it was given by)."""
    part = self.of(config)
    return Settings({key: getattr(config, key)
                     for key in (self.key, *part.keys)})

  def listed(self):
    """The accepted names, as an error lists them."""
    return (', '.join(self.names())
            + (f', {self.accepted}' if self.accepted else '')
            + (f', or {self.left_open[0]!r} ({self.left_open[1]})'
               if self.left_open else ''))

  def keys(self):
    """{config key: Key} of every part's own keys."""
    keys = {}
    for part in self.parts():
      for name, key in part.keys.items():
        if keys.setdefault(name, key) != key:
          raise ValueError(f'config key {name!r} declared twice, unlike')
    return keys

  def check(self, config):
    """A one-line UserError if `config` names no part of this table (nor
    leaves it open), or its part's keys cannot run."""
    if self.left_open and getattr(config, self.key) == self.left_open[0]:
      return
    self.of(config).check(self.settings(config))
