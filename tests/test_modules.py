"""`bayesurl._modules.eval_mode`: eval inside the block, the training flag restored after."""

import pytest
from torch import nn

from bayesurl._modules import eval_mode


@pytest.mark.parametrize("training", [True, False])
def test_eval_mode_restores_the_flag_also_on_error(training: bool) -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train(training)
    with eval_mode(net) as m:
        assert m is net
        assert not any(mod.training for mod in net.modules())
    assert all(mod.training == training for mod in net.modules())
    with pytest.raises(RuntimeError, match="boom"), eval_mode(net):
        raise RuntimeError("boom")
    assert all(mod.training == training for mod in net.modules())
