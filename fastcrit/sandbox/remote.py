"""placeholder until written"""
class RemoteSandbox:  # replaced below
    pass
