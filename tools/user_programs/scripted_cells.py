# Untuned: TorchScript as in PyTorch's "fast RNNs" custom_lstms.py: an LSTM cell as a
# torch.jit.ScriptModule (@torch.jit.script_method), a layer looping over input.unbind(0) inside
# script, two layers stacked in a scripted ModuleList, a linear head on the last hidden state;
# trained with SGD together with a torch.fx.symbolic_trace'd MLP GraphModule (sum of the two
# losses). The profiling executor specializes the scripted graphs after the first runs. 3 steps.
import math, torch, torch.nn as nn, torch.nn.functional as F
from typing import List, Tuple
from torch import Tensor
from common import setup, report
policy = setup()

class LSTMCell(torch.jit.ScriptModule):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        k = 1.0 / math.sqrt(hidden_size)
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size).uniform_(-k, k))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size).uniform_(-k, k))
        self.bias_ih = nn.Parameter(torch.empty(4 * hidden_size).uniform_(-k, k))
        self.bias_hh = nn.Parameter(torch.empty(4 * hidden_size).uniform_(-k, k))

    @torch.jit.script_method
    def forward(self, input: Tensor, state: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        hx, cx = state
        gates = (torch.mm(input, self.weight_ih.t()) + self.bias_ih +
                 torch.mm(hx, self.weight_hh.t()) + self.bias_hh)
        ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
        ingate = torch.sigmoid(ingate)
        forgetgate = torch.sigmoid(forgetgate)
        cellgate = torch.tanh(cellgate)
        outgate = torch.sigmoid(outgate)
        cy = (forgetgate * cx) + (ingate * cellgate)
        hy = outgate * torch.tanh(cy)
        return hy, (hy, cy)

class LSTMLayer(torch.jit.ScriptModule):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.cell = LSTMCell(input_size, hidden_size)

    @torch.jit.script_method
    def forward(self, input: Tensor, state: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        inputs = input.unbind(0)
        outputs = torch.jit.annotate(List[Tensor], [])
        for i in range(len(inputs)):
            out, state = self.cell(inputs[i], state)
            outputs += [out]
        return torch.stack(outputs), state

class StackedLSTM(torch.jit.ScriptModule):
    def __init__(self, num_layers, input_size, hidden_size):
        super().__init__()
        self.layers = nn.ModuleList([LSTMLayer(input_size, hidden_size)] +
                                    [LSTMLayer(hidden_size, hidden_size) for _ in range(num_layers - 1)])

    @torch.jit.script_method
    def forward(self, input: Tensor, states: List[Tuple[Tensor, Tensor]]) -> Tuple[Tensor, List[Tuple[Tensor, Tensor]]]:
        output_states = torch.jit.annotate(List[Tuple[Tensor, Tensor]], [])
        output = input
        i = 0
        for rnn_layer in self.layers:
            state = states[i]
            output, out_state = rnn_layer(output, state)
            output_states += [out_state]
            i += 1
        return output, output_states

class MLP(nn.Module):
    def __init__(self, d_in=256, d_hidden=512, n_cls=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, n_cls)
        self.drop = nn.Dropout(0.1)
    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        x = self.drop(F.gelu(self.fc2(x))) + x
        return self.fc3(x)

T, B, I, H = 32, 64, 64, 256
rnn = StackedLSTM(2, I, H)
head = nn.Linear(H, 10)
mlp = torch.fx.symbolic_trace(MLP())
params = list(rnn.parameters()) + list(head.parameters()) + list(mlp.parameters())
opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    seq = torch.randn(T, B, I, generator=g)
    y_seq = torch.randint(0, 10, (B,), generator=g)
    x = torch.randn(512, 256, generator=g)
    y = torch.randint(0, 10, (512,), generator=g)
    states = [(torch.zeros(B, H), torch.zeros(B, H)) for _ in range(2)]
    out, _ = rnn(seq, states)
    loss = F.cross_entropy(head(out[-1]), y_seq) + F.cross_entropy(mlp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
report(policy, [rnn, head, mlp], losses)
