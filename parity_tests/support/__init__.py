"""What the tests share: model pairs, inputs, comparisons and bounds. Tests import from here,
never from each other."""
