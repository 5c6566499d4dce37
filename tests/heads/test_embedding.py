import pytest
import torch
from torch import nn

from bayesurl.backbones import SmallConvNet
from bayesurl.heads.embedding import EmbeddingNet, build_backbone


def test_small_convnet_by_name_and_projection():
    net = EmbeddingNet("small_convnet", embed_dim=16, num_features=24)
    assert isinstance(net.backbone, SmallConvNet)
    assert net.feature_dim == 24 and net.embed_dim == 16
    assert net(torch.randn(3, 1, 28, 28)).shape == (3, 16)
    net.eval()
    x = torch.randn(2, 1, 28, 28)
    feats = net.backbone(x)
    assert torch.allclose(net(x), feats @ net.proj.weight.T + net.proj.bias, atol=1e-6)


def test_identity_without_embed_dim_and_module_probe():
    lin = nn.Sequential(nn.Linear(5, 7))
    net = EmbeddingNet(lin, probe_input=torch.zeros(1, 5))
    x = torch.randn(4, 5)
    assert net.embed_dim == 7
    assert torch.equal(net(x), lin(x))


def test_bad_input():
    with pytest.raises(ValueError, match="embed_dim"):
        EmbeddingNet("small_convnet", embed_dim=0)
    with pytest.raises(ValueError, match="probe_input"):
        build_backbone(nn.Sequential(nn.Linear(3, 3)))
    net = EmbeddingNet(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="`x`"):
        net(torch.tensor([[float("nan"), 0.0, 0.0]]))

    class ThreeD(nn.Module):
        num_features = 3

        def forward(self, x):
            return x.unsqueeze(1)

    with pytest.raises(ValueError, match="backbone output"):
        EmbeddingNet(ThreeD())(torch.zeros(2, 3))
