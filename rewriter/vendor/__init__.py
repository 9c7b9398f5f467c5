"""vendor"""
