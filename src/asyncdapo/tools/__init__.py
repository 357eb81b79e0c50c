"""Tools: the local stack (`asyncdapo up`), the chaos/fault harness, the simulator, dataset and model
tools, verl conversion. They may import anything below; nothing imports them."""
