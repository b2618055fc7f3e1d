"""Twin of ``jaxformer/models/bert.py``: BERT in PyTorch, same classes, attributes and arguments."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from jaxformer import validate
from jaxformer.config import BertConfig
from torch_ref.nn.layers import ACTIVATIONS, TransformerBlock
from torch_ref.nn.masks import padding_mask
from torch_ref.nn.params import init_weights, layer_norm
from torch_ref.nn.stack import LayerStack


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = layer_norm(config) if config.embedding_layer_norm else None
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, input_ids, token_type_ids):
        T = input_ids.shape[1]
        x = (self.word_embeddings(input_ids)  # (B, T, C)
             + self.position_embeddings(torch.arange(T, device=input_ids.device))[None]
             + self.token_type_embeddings(token_type_ids))
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return self.dropout(x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = LayerStack(config, TransformerBlock, config.num_layers)

    def forward(self, hidden_states, mask=None):
        return self.layers(hidden_states, mask)


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, 0]))


class BertModel(nn.Module):
    def __init__(self, config: BertConfig, *, add_pooler: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooler else None
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        validate.check_bert_inputs(self.config, input_ids, token_type_ids, attention_mask)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None if attention_mask is None else padding_mask(attention_mask)  # (B, 1, 1, T)
        sequence_output = self.encoder(self.embeddings(input_ids, token_type_ids), mask)
        pooled_output = None if self.pooler is None else self.pooler(sequence_output)
        return sequence_output, pooled_output


def gather_positions(hidden_states, positions):
    validate.check_masked_positions(positions, hidden_states.shape)
    index = positions[:, :, None].expand(-1, -1, hidden_states.shape[-1])
    return torch.gather(hidden_states, 1, index)


class BertMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = config.activation
        self.layer_norm = layer_norm(config)
        self.decoder = (None if config.tie_word_embeddings else
                        nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states, masked_positions=None, word_embeddings=None):
        if masked_positions is not None:
            hidden_states = gather_positions(hidden_states, masked_positions)
        x = self.layer_norm(ACTIVATIONS[self.activation](self.dense(hidden_states)))
        if self.decoder is None:
            if word_embeddings is None:
                raise ValueError("BertMLMHead has tied weights: pass word_embeddings")
            logits = F.linear(x, word_embeddings.weight)
        else:
            logits = self.decoder(x)
        return logits + self.bias


class BertNSPHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled_output):
        return self.classifier(pooled_output)


class BertForPreTraining(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = BertMLMHead(config)
        self.nsp = BertNSPHead(config)
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_positions=None):
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        mlm_logits = self.mlm(sequence_output, masked_positions,
                              self.bert.embeddings.word_embeddings)
        return sequence_output, mlm_logits, self.nsp(pooled_output)


class BertForSequenceClassification(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        _, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(pooled_output))


class BertForMaskedLM(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.mlm = BertMLMHead(config)
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                masked_positions=None):
        sequence_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.mlm(sequence_output, masked_positions, self.bert.embeddings.word_embeddings)
