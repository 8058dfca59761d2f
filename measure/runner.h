// The trusted runner's request loop. `ktune-runner` loads the task's
// weights once, makes them resident on its backend, then answers one JSON
// request per line on stdin with one JSON reply per line on stdout:
//
//   {"op":"hello"}                      -> {"ok":true,"facts":{...}}
//   {"op":"probe"}                      -> {"ok":true,"probes":[{name,value,unit,detail}]}
//   {"op":"load","artifact":PATH}       -> {"ok":true,"declared_launches":N}
//        (runs the variant's prepare table, if any, before answering: abi.h)
//   {"op":"validate","cases":[{"seed":S,"context":L}],"out_dir":DIR}
//        -> {"ok":true,"files":[...],"launches_per_step":N,"step_us":[...]}
//           (each file: safetensors with hidden, L{i}.S/cq/ck/cv, L{i}.c_kv_row/k_rope_row, topk)
//   {"op":"time","contexts":[[L,steps],...],"warmup":W,"samples":N,"seed":S[,"back_to_back":B,"batches":K]}
//        -> {"ok":true,"timings":[{"context":L,"steps":s,"warmup":W,"samples_us":[...]
//                                  [,"back_to_back_steps":B,"back_to_back_us":[...]]}]}
//           (samples_us: each step timed alone; back_to_back_us: K batches of B steps
//           launched one after another, each batch's time per step)
//   {"op":"profile","contexts":[[L,steps],...],"warmup":W,"samples":N}
//        -> {"ok":true,"profiles":[{"context":L,"runs":[{"us":T,"stamps":[[tag,ns],...],
//                                                         "arrivals":[[first,median,last,block],...]}]}]}
//           (the stamps a profiled variant wrote into args.trace, one list per step; per grid
//           barrier, the ns at which the first, the median and the last block arrived, and
//           which block was last)
//   {"op":"quit"}
//
// A failure is {"ok":false,"outcome":"launch_error"|"device_fault","error":TEXT}.
// After a device fault the runner exits (status 3): the device is unusable
// and the client starts a new runner. Comparing outputs with the oracle is
// the client's job, so a variant cannot fake validation.
#pragma once

namespace ktune::measure {

int runner_main(int argc, char** argv);

}  // namespace ktune::measure
