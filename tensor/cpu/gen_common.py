"""What the micro-kernel generators (gen_kernel.py, gen_dot.py) share: the tile
height and the epilogue that adds a tile of accumulators to C or stores it."""
MR = 12


def store(flag, p):
    """The tile's epilogue: add the accumulators to c (flag set) or store them."""
    print(f'''\tMOVBQZX {flag}, AX
\tTESTQ AX, AX
\tJEQ {p}set''')
    for i in range(MR):
        print(f'\tVADDPS (DX), Z{2 * i}, Z{2 * i}')
        print(f'\tVMOVUPS Z{2 * i}, (DX)')
        print(f'\tVADDPS 64(DX), Z{2 * i + 1}, Z{2 * i + 1}')
        print(f'\tVMOVUPS Z{2 * i + 1}, 64(DX)')
        if i < MR - 1:
            print('\tADDQ R8, DX')
    print('\tVZEROUPPER\n\tRET')
    print(f'{p}set:')
    for i in range(MR):
        print(f'\tVMOVUPS Z{2 * i}, (DX)')
        print(f'\tVMOVUPS Z{2 * i + 1}, 64(DX)')
        if i < MR - 1:
            print('\tADDQ R8, DX')
    print('\tVZEROUPPER\n\tRET')
