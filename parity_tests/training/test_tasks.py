"""The Task registry (``jaxformer.training.tasks``): one framework-free object per objective that
both frameworks select by the same key. Each Task's loss and model must exist under the same name
on both sides (that importing it loads no framework is ``parity_tests/test_packaging.py``'s).
"""

from __future__ import annotations

import pytest

from jaxformer.training import losses as jax_losses
from jaxformer.training import step as jax_step
from jaxformer.training import tasks
from torch_ref.training import losses as torch_losses
from torch_ref.training import step as torch_step


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_each_task_names_a_loss_and_a_model_both_frameworks_have(name):
    task = tasks.get(name)
    assert task.name == name
    assert callable(getattr(jax_losses, task.loss))
    assert callable(getattr(torch_losses, task.loss))
    assert jax_step.MODELS[name].__name__ == torch_step.MODELS[name].__name__ == task.model
    assert task.default_schedule in ("linear", "inverse_sqrt")


def test_unknown_key_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown family 'nope'; choose one of \['bert', "):
        tasks.get("nope")

