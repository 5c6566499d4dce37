"""Backbones: any ``nn.Module`` mapping images to features ``[N, F]``, a timm model name, or
the small conv net used by the embedded default (28 x 28 grayscale images)."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["SmallConvNet"]


class SmallConvNet(nn.Module):
    """A four-block conv net for 28 x 28 images (FashionMNIST, upsampled digits).

    Small enough to train eleven methods on two CPU cores in minutes; the LAM paper uses a
    network of this size for its FashionMNIST experiments (LAM section 5).

    Parameters
    ----------
    in_channels : int
        Image channels (1 for grayscale).
    num_features : int
        Output feature dimension F.
    width : int
        Channels of the first block (doubled once).
    dropout : float
        Dropout before the last linear layer (0 disables it).
    """

    def __init__(
        self, in_channels: int = 1, num_features: int = 128, width: int = 32, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.num_features = num_features
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 14
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 7
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            nn.Linear(2 * width, num_features),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))
